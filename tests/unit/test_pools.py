"""``onward worker``'s pool options: what reaches ``celery worker``, what is refused, and
when the standard library is patched for gevent."""

from __future__ import annotations

import pytest

from ledger.exceptions import InvalidInput
from tasks.workflow import Registry
from workers.greenpatch import green_pool_requested
from workers.pools import PoolKind, PoolOptions, check_pool_runs


def test_pools__options_pass_through_to_celery() -> None:
    """Every option an operator gives reaches ``celery worker`` unchanged, pool first."""
    options = PoolOptions(PoolKind.PREFORK, 4, autoscale="8,2", max_tasks_per_child=100,
                          max_memory_per_child=200_000, prefetch_multiplier=2)
    assert options.celery_args() == [
        "-P", "prefork", "-c", "4", "--autoscale", "8,2", "--max-tasks-per-child", "100",
        "--max-memory-per-child", "200000", "--prefetch-multiplier", "2"]
    assert PoolOptions(PoolKind.THREADS, 64).celery_args() == ["-P", "threads", "-c", "64"]


def test_pools__ledger_pool_is_sized_to_the_steps_of_one_process() -> None:
    """A prefork child runs one step at a time; a threads or gevent process runs -c."""
    assert PoolOptions(PoolKind.PREFORK, 8).steps_per_process == 1
    assert PoolOptions(PoolKind.THREADS, 64).steps_per_process == 64
    assert PoolOptions(PoolKind.GEVENT, 500).steps_per_process == 500


@pytest.mark.parametrize("options", [
    {"pool": PoolKind.THREADS, "autoscale": "4,1"},
    {"pool": PoolKind.GEVENT, "max_tasks_per_child": 10},
    {"pool": PoolKind.THREADS, "max_memory_per_child": 1000},
    {"autoscale": "4"},
    {"autoscale": "1,4"},
    {"autoscale": "x,y"},
    {"concurrency": 0},
    {"prefetch_multiplier": 0},
])
def test_pools__impossible_options_are_refused_with_what_to_do(options: dict[str, object]
                                                               ) -> None:
    """Options Celery would silently ignore on that pool, or could not parse, are refused
    before the worker starts, with a message naming the option."""
    autoscale_alone = options == {"autoscale": "4"}
    if autoscale_alone:  # MAX alone is Celery's own shorthand for MAX,0
        assert PoolOptions(**options).autoscale_bounds() == (4, 0)  # type: ignore[arg-type]
        return
    with pytest.raises(InvalidInput) as refused:
        PoolOptions(**options)  # type: ignore[arg-type]
    assert "must be" in str(refused.value) or "--" in str(refused.value)


@pytest.mark.parametrize(("argv", "expected"), [
    (["/usr/bin/onward", "worker", "-P", "gevent", "-c", "500"], "gevent"),
    (["-m", "worker", "--pool=gevent"], "gevent"),
    (["onward", "worker", "-Pgevent"], "gevent"),
    (["onward", "worker", "-P", "threads"], None),
    (["onward", "runs", "ls", "-P", "gevent"], None),
    (["/venv/bin/pytest", "worker", "-P", "gevent"], None),
])
def test_pools__gevent_patching_only_for_a_gevent_worker(argv: list[str],
                                                         expected: str | None) -> None:
    """Only ``onward worker -P gevent`` patches the standard library (at import of the
    console package, before psycopg is imported); no other command or program does."""
    assert green_pool_requested(argv) == expected


def test_pools__gevent_refuses_async_workflows_at_start() -> None:
    """A workflow with async steps or tools cannot run on gevent: the worker refuses it when
    it starts, naming the workflow and its async parts and saying which pool to use; the
    threads and prefork pools take it."""
    registry = Registry()
    registry.load_modules(["tests.workflows_async"])
    with pytest.raises(InvalidInput, match=r"gevent pool cannot run async.*test_async v1: "
                                           r"async step .*--pool threads"):
        check_pool_runs(PoolKind.GEVENT, registry)
    for pool in (PoolKind.THREADS, PoolKind.PREFORK, PoolKind.SOLO):
        check_pool_runs(pool, registry)
    plain = Registry()
    plain.load_modules(["tests.workflows"])
    check_pool_runs(PoolKind.GEVENT, plain)
