"""Seconds and CPU seconds of the start-up work (``kura.storage.recovery``'s steps in one
thread, as ``CacheService.start(background=False)`` runs them: ``open_index``, the staging
sweep and migration, then ``check_index`` and ``reconcile``; ``kura serve`` runs the last two
behind its listener) on a data dir seeded by ``bench.startup``, in a fresh process per repeat with the page cache dropped (as
root; warm otherwise, and the output says which). CPU seconds (user + system, of this process)
move less with the machine's load than wall seconds do.

    python -m bench.open_storage_time --dir /var/tmp/kura-startup/n100000-s512-files --repeat 3

``--phase rows`` times only the index walk reconcile does (the narrow rows when the code has
``current_versions_after``, else manifests), ``--phase rows-manifests`` the manifest walk of
before, ``--page`` its page size.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench.cachebench import loadavg
from bench.startup import drop_page_cache


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(where: Path, phase: str, page: int) -> dict[str, object]:
    from kura.storage.blobs import BlobFiles
    from kura.storage.index import MetadataIndex
    from kura.storage.reconcile import reconcile
    from kura.storage.recovery import check_index, note_reconciled, open_index

    files = BlobFiles(where / "data", where / "tmp")
    t0, c0 = time.perf_counter(), cpu()
    out: dict[str, object] = {}
    if phase == "startup":
        index, report = open_index(files)
        if not report.checked:
            check_index(index, report)
        note_reconciled(report, reconcile(files, index))
        out["quick_check_s"] = round(report.quick_check_seconds, 3)
        out["removed_files"] = report.reconciled.removed_files
    else:
        files.open()
        index = MetadataIndex(where / "data" / "index.sqlite3")
        paging = index.paging
        narrow = phase == "rows" and hasattr(paging, "current_versions_after")
        after, rows = None, 0
        while True:
            if narrow:
                got = paging.current_versions_after(after, page)
                if not got:
                    break
                after = got[-1][0]
            else:
                manifests = paging.manifests_after(after, page)
                if not manifests:
                    break
                after, got = manifests[-1].artifact_id, manifests
            rows += len(got)
        out["rows"] = rows
    out.update(wall_s=round(time.perf_counter() - t0, 3), cpu_s=round(cpu() - c0, 3))
    index.close_thread_connection()
    files.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, required=True, help="a seeded node dir (data, tmp)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--phase", default="startup", choices=["startup", "rows", "rows-manifests"])
    p.add_argument("--page", type=int, default=1000)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.dir, a.phase, a.page)))
        return
    for repeat in range(a.repeat):
        cold = drop_page_cache()
        load = loadavg()
        args = ["--dir", str(a.dir), "--phase", a.phase, "--page", str(a.page), "--child"]
        done = subprocess.run(
            [sys.executable, "-m", "bench.open_storage_time", *args],
            capture_output=True,
            text=True,
            check=True,
            env=os.environ,
        )
        row = {"repeat": repeat, "page_cache": "dropped" if cold else "warm", "load": load}
        row.update(json.loads(done.stdout))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
