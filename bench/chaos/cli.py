"""``python -m bench.chaos``: run the bench, print a summary on stderr and ONE JSON line
on stdout. Exit status 0 when the pass bar holds, 1 when it does not, 2 when the bench
could not run."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from bench.chaos import loop
from bench.chaos.config import Config, config_of, parse_args
from bench.chaos.log import log, quiet
from bench.chaos.state import Chaos
from bench.chaos.verdict import summary_lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet(args.json)
    cfg = config_of(args)
    if cfg.pause_ms / 1000.0 >= cfg.lease_ttl_s / 2:
        print("--pause-ms must stay well under the lease TTL", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix=f"onward-chaos-{cfg.seed}-"))
    log(f"work dir {workdir}", always=True)
    report, code = run_once(cfg, workdir)
    if report is None:
        print(json.dumps({"error": "the bench did not complete", "seed": cfg.seed,
                          "work_dir": str(workdir)}))
        return code
    publish(report, code, cfg, workdir)
    return code


def run_once(cfg: Config, workdir: Path) -> tuple[dict[str, Any] | None, int]:
    """(the report or None, the exit status); tears everything down, keeping the database
    and the logs when the pass bar failed or ``--keep``."""
    chaos = Chaos(cfg, workdir)
    report: dict[str, Any] | None = None
    code = 2
    try:
        report = loop.run(chaos)
        code = 0 if report["pass"] else 1
    except KeyboardInterrupt:
        log("interrupted", always=True)
    except Exception:
        log("bench failed:\n" + traceback.format_exc(), always=True)
    finally:
        loop.teardown(chaos, keep_db=cfg.keep or code == 1)
    return report, code


def publish(report: dict[str, Any], code: int, cfg: Config, workdir: Path) -> None:
    report["work_dir"] = str(workdir)
    for line in summary_lines(report):
        log(line, always=True)
    if code == 0 and not cfg.keep:
        shutil.rmtree(workdir, ignore_errors=True)
        report.pop("work_dir")
    else:
        log(f"logs kept in {workdir}", always=True)
    print(json.dumps(report, default=str), flush=True)
