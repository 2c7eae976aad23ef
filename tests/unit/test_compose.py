"""compose.yaml and deploy/Dockerfile, checked without a Docker engine.

Nothing here starts a container (this machine has no engine). What can be checked from the
files is: every command a service runs exists in the code, every ``depends_on`` waits on
a condition the target can meet, every onward process gets the same ledger, broker and
checkpoint key, and each connects as the database role its job needs (only the migration as
the tables' owner; tests/acceptance/test_deploy_roles.py runs the roles' init script).
"""

from __future__ import annotations

import importlib
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from console.cli import app

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
INIT_DIR = ROOT / "deploy" / "postgres" / "initdb"
EXPECTED = {"postgres", "redis", "migrate", "worker", "dispatcher", "reaper", "flower",
            "console", "metrics"}
SHARED_ENV = ("ONWARD_BROKER_URL", "ONWARD_CHECKPOINT_KEY")
OWNER, APP, OPERATOR = "onward_owner", "onward_app", "onward_operator"
ROLES = {"migrate": OWNER, "console": APP, "worker": OPERATOR, "dispatcher": OPERATOR,
         "reaper": OPERATOR, "metrics": OPERATOR, "flower": OPERATOR}
"""The role each onward service connects as (docs/operating.md, "Database roles"). Flower
reads only the broker; it inherits the operator's URL and never uses it."""
_URL = re.compile(r"postgresql://(?P<role>[^:@/]+):\$\{(?P<password>[A-Z_]+):-[^}]+\}"
                  r"@(?P<where>postgres:5432/onward)")


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services


def _command(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return command if isinstance(command, list) else shlex.split(command)


def _onward_services() -> dict[str, dict[str, Any]]:
    """Services built from deploy/Dockerfile (the ones that run onward's code)."""
    return {name: s for name, s in _services().items()
            if s.get("build", {}).get("dockerfile") == "deploy/Dockerfile"}


def _resolve_onward(args: list[str]) -> Any:
    """Walk ``onward a b …`` through the typer app and parse the options the leaf gets.

    Groups are recognised by their ``commands`` (typer vendors its own click, so the click
    classes are not the ones ``import click`` gives).
    """
    command = typer.main.get_command(app)
    path = ["onward"]
    rest = list(args)
    while hasattr(command, "commands"):
        if not rest or rest[0] not in command.commands:
            known = sorted(command.commands)
            raise AssertionError(f"`{' '.join(path)}` has no subcommand {rest[:1]}; known: {known}")
        name = rest.pop(0)
        path.append(name)
        command = command.commands[name]
    command.make_context(" ".join(path), rest)  # raises on an unknown option or bad value
    return command


def test_compose__defines_every_service() -> None:
    """The stack named in docs/design.md: ledger, broker, migration and the three process kinds."""
    assert set(_services()) >= EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_compose__service_command_exists(name: str) -> None:
    """Each service runs a command this code has: an ``onward`` (sub)command registered on
    ``console.cli.app`` with options it accepts, or an installed ``celery``."""
    service = _services()[name]
    if "command" not in service:
        assert "image" in service, f"{name} has neither a command nor an image"
        return
    executable, *args = _command(service)
    if executable == "onward":
        _resolve_onward(args)
    elif executable == "celery":
        assert (Path(sys.executable).parent / "celery").exists(), "celery is not installed"
    elif name not in _onward_services():
        return  # a stock image's own server (postgres, redis-server)
    else:
        raise AssertionError(f"{name} runs {executable!r}, which onward's image does not provide")


def test_compose__onward_subcommands_are_resolved_strictly() -> None:
    """The resolver used above refuses what does not exist (so the check can fail)."""
    _resolve_onward(["db", "upgrade"])
    with pytest.raises(AssertionError, match="no subcommand"):
        _resolve_onward(["db", "migrate"])
    with pytest.raises(Exception, match="No such option"):
        _resolve_onward(["worker", "--no-such-option"])
    assert _resolve_onward(["worker", "--concurrency", "4"]).name == "worker"


def test_compose__flower_is_installed_in_the_image() -> None:
    """``celery flower`` needs the flower package, which the project does not depend on."""
    assert "flower" in _command(_services()["flower"])
    assert "flower" in DOCKERFILE.read_text()


def test_compose__depends_on_waits_on_conditions_targets_can_meet() -> None:
    """``service_healthy`` targets have a healthcheck; ``service_completed_successfully``
    targets are one-shot (``restart: "no"``). Nothing starts merely because another
    container was created."""
    services = _services()
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on must name conditions"
        for target, spec in depends.items():
            assert target in services, f"{name} depends on undefined service {target}"
            condition = spec.get("condition")
            if condition == "service_healthy":
                assert services[target].get("healthcheck", {}).get("test"), (
                    f"{name} waits for {target} to be healthy, but {target} has no healthcheck")
            elif condition == "service_completed_successfully":
                assert services[target].get("restart") == "no", (
                    f"{name} waits for {target} to complete, but {target} restarts")
            else:
                raise AssertionError(f"{name} -> {target}: condition {condition!r}")


def test_compose__onward_processes_wait_for_the_migration() -> None:
    """A worker, dispatcher or reaper refuses to start on a schema at another revision, so
    each waits for ``migrate`` to finish, and ``migrate`` for a healthy PostgreSQL."""
    services = _services()
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("worker", "dispatcher", "reaper"):
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully")


def test_compose__onward_processes_share_ledger_broker_and_checkpoint_key() -> None:
    """Checkpoints are MACed with ONWARD_CHECKPOINT_KEY: a process with another key (or a
    key generated in its own container) would take every checkpoint for tampered. Every
    process reaches the same database (under the role of its own, below)."""
    onward = _onward_services()
    assert {"migrate", "worker", "dispatcher", "reaper", "flower", "console"} <= set(onward)
    for key in SHARED_ENV:
        values = {name: s.get("environment", {}).get(key) for name, s in onward.items()}
        assert len(set(values.values())) == 1 and None not in values.values(), (key, values)
    places = {_database_url(name)["where"] for name in onward}
    assert places == {"postgres:5432/onward"}, places


def _database_url(name: str) -> dict[str, str]:
    url = str(_services()[name].get("environment", {}).get("ONWARD_DATABASE_URL"))
    match = _URL.fullmatch(url)
    assert match, f"{name}: ONWARD_DATABASE_URL {url!r} is not role:${{PASSWORD:-…}}@postgres"
    return match.groupdict()


def test_compose__only_the_migration_connects_as_the_owner() -> None:
    """Row-level security is forced, but the owner can switch it off and bypasses it
    (deploy/postgres/initdb): only ``migrate`` (``onward db upgrade``) connects as the
    owner; the console as onward_app (one tenant per request), the fleet as
    onward_operator; no onward service connects as the PostgreSQL superuser."""
    onward = _onward_services()
    assert set(onward) == set(ROLES), "a new onward service needs its role in ROLES"
    superuser = _services()["postgres"]["environment"]["POSTGRES_USER"]
    for name in onward:
        role = _database_url(name)["role"]
        assert role == ROLES[name], f"{name} connects as {role}, not {ROLES[name]}"
        assert role != superuser, f"{name} connects as the superuser"
    owners = [name for name in onward if _database_url(name)["role"] == OWNER]
    assert owners == ["migrate"]
    assert _command(onward["migrate"]) == ["onward", "db", "upgrade"]


def test_compose__role_passwords_come_from_the_environment_and_match_the_init_script() -> None:
    """Each role's password is a compose variable (the environment or .env), the same one
    the postgres service hands to the init script that creates the role with it; the init
    script is mounted where the image runs it on first start."""
    postgres = _services()["postgres"]
    assert "./deploy/postgres/initdb:/docker-entrypoint-initdb.d:ro" in postgres["volumes"]
    script = (INIT_DIR / "10-onward-roles.sh").read_text()
    given = postgres["environment"]
    for name in _onward_services():
        url = _database_url(name)
        variable = url["password"]
        assert given.get(variable) == _interpolation(name, variable), (name, variable)
        assert f'"${variable}"' in script, f"the init script does not read {variable}"
        assert re.search(rf"CREATE ROLE {url['role']} LOGIN NOSUPERUSER", script), url["role"]
    assert re.search(r"CREATE ROLE onward_app .*NOBYPASSRLS", script)
    assert re.search(r"CREATE ROLE onward_operator .*NOBYPASSRLS", script)
    assert "ALTER DATABASE :\"database\" OWNER TO onward_owner" in script


def _interpolation(name: str, variable: str) -> str:
    """``${VARIABLE:-default}`` as the service's URL spells it (so a default matches)."""
    url = str(_services()[name]["environment"]["ONWARD_DATABASE_URL"])
    found = re.search(r"\$\{" + variable + r":-[^}]+\}", url)
    assert found, (name, variable)
    return found.group(0)


def test_compose__worker_workflows_are_importable_and_in_the_image() -> None:
    """The modules in ONWARD_WORKFLOWS import here and are copied into the image."""
    modules = _services()["worker"]["environment"]["ONWARD_WORKFLOWS"].split(",")
    dockerfile = DOCKERFILE.read_text()
    for module in modules:
        importlib.import_module(module.strip())
        top = module.strip().split(".")[0]
        assert f"COPY {top} {top}" in dockerfile, f"{top}/ is not copied into the image"


def test_dockerfile__installs_the_project_on_python_3_11_slim() -> None:
    """The image is python:3.11-slim with the project pip-installed (the `onward` script)."""
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines()]
    assert "FROM python:3.11-slim" in lines
    assert any(line.startswith(("RUN pip install .", "RUN pip install \".")) for line in lines)
    for package in ("ledger", "tasks", "workers", "console"):
        assert f"COPY {package} {package}" in lines


def test_compose__rabbitmq_is_a_profile_and_the_broker_url_can_point_at_it() -> None:
    """``--profile rabbitmq`` adds a RabbitMQ with a healthcheck; the default stack stays on
    Redis; ONWARD_BROKER_URL overrides the broker of every onward process (and Flower), and
    those that wait for a broker wait for RabbitMQ only when its profile is on."""
    services = _services()
    rabbit = services["rabbitmq"]
    assert rabbit["profiles"] == ["rabbitmq"] and rabbit["healthcheck"]["test"]
    assert "profiles" not in services["redis"]
    text = COMPOSE.read_text()
    assert "ONWARD_BROKER_URL: &broker ${ONWARD_BROKER_URL:-redis://redis:6379/0}" in text
    for name in ("worker", "dispatcher", "flower"):
        spec = services[name]["depends_on"]["rabbitmq"]
        assert spec == {"condition": "service_healthy", "required": False}, name
