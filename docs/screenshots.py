#!/usr/bin/env python3
"""Fresh README screenshots of the Dagster UI, made from a real schedule tick.

    python3 docs/screenshots.py            # from the repository root (any cwd works)

Run it with a Python that has Playwright (the system ``python3`` here, not the project's uv
venv); it drives the Debian Chromium (``/usr/bin/chromium``) headless. It does, in order:

1. registers a throwaway second corpus, ``handbook`` (three short Markdown files and a golden set
   of two queries in a temporary folder), with ``uv run python -m retrieval_assets corpus add``;
2. starts ``uv run python -m retrieval_assets.ui dev`` (``dagster dev`` on this project's
   instance: runs and events in Postgres, the daemon included) on a free port in its own
   process group, and waits for ``/server_info`` and the code location (which loads both corpora);
3. tops up the history the trend plots need: while ``fixture/embedder_comparison`` has fewer
   than ``--min-points`` materialisations carrying ``hash/ndcg@k`` (counting the one the tick
   will add), it runs the README's main command ``uv run dg launch --job evaluate_embedders
   --partition hash`` (at most twice); then runs the second corpus's job once
   (``uv run dg launch --job evaluate_embedders__handbook --partition hash``);
4. as a user would, clicks Automation > ``nightly_evaluation`` (the fixture corpus's schedule) >
   "Preview tick result" (the 1.13 name of "Test schedule"), evaluates the schedule for its
   latest 03:00 UTC tick, checks the run requests and clicks "Launch all & commit tick result";
   the runs it launched (ids from the runs page the UI opens) are polled over GraphQL until they
   finish (15 minutes at most); any failed run stops the script before a screenshot is taken.
   Each corpus's ``eval_trend`` (group ``<corpus>_reports``) is refreshed after its ``eval_run``
   by its ``reports_after_evaluation`` sensor under the daemon: the script waits until the
   latest materialisation of each is newer than its ``eval_run``'s;
5. screenshots, each checked to show what it is named after:
   ``docs/asset-graph.png``      the ``fixture`` group's lineage, detailed nodes, whole graph;
   ``docs/eval-run.png``         ``fixture/eval_run``'s partition ``hash``: latest
                                 materialisation and its metadata table (headline keys first);
   ``docs/embedder-trend.png``   ``fixture/embedder_comparison``'s Plots view from
                                 ``hash/ndcg@k`` to ``minilm/ndcg@k``;
   ``docs/eval-trend.png``       ``fixture/eval_trend``'s latest materialisation with its
                                 ``plot`` Markdown image open;
   ``docs/corpora.png``          the global asset lineage, groups collapsed: the four groups of
                                 each corpus (``fixture``, ``fixture_reports``, ... ``handbook_live``);
6. removes the second corpus (also when a step failed): its runs (tag ``retrieval/corpus``) are
   deleted and its assets wiped in the Dagster instance, then ``corpus remove handbook --yes``
   drops its schemas, history rows and stored values; its reports and folder are deleted
   (Dagster keeps only what its UI does not show: the wipe markers and the sensor's ticks);
7. stops the UI (SIGINT to its process group; SIGTERM, then SIGKILL if it lingers).

The UI log and the tick dialog's screenshots go to a temporary folder (printed at the end).
Nothing in the repository changes besides the five PNGs: the runs write only under the
git-ignored ``.retrieval/``, and what the webserver creates under DAGSTER_HOME (the root), a
``.nux/`` when the community dialog is skipped and empty ``logs/`` and ``.logs_queue/``, is
removed again. Options: ``--port``, ``--min-points``, ``--timeout`` (``--help``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CHROMIUM = "/usr/bin/chromium"
# What dagster dev creates in $DAGSTER_HOME (the root): .nux/ ("community dialog seen", when the
# dialog is skipped) and the telemetry folders logs/ and .logs_queue/ (empty, telemetry being off).
# The script removes what it created there, so that git status and the tree stay as they were.
DAGSTER_DIRS = (ROOT / ".nux", ROOT / "logs", ROOT / ".logs_queue")
SCHEDULE = "nightly_evaluation"
JOB = "evaluate_embedders"
CORPUS = GROUP = "fixture"  # the fixture corpus: its assets are keyed fixture/<name>, its evaluated chain is group fixture
MAIN_COMMAND = ["uv", "run", "dg", "launch", "--job", JOB, "--partition", "hash"]
# The throwaway second corpus of docs/corpora.png: registered for the run of the script, removed after it.
SECOND = "handbook"
SECOND_FILES = {
    "onboarding.md": "# Onboarding\n\nA new engineer gets a laptop on the first day and pairs with a buddy for two\n"
                     "weeks. The buddy reviews the first three pull requests.\n",
    "deploys.md": "# Deploys\n\nWe deploy from the main branch once the checks pass. A deploy on a Friday\n"
                  "afternoon needs a second reviewer. When a release goes wrong, roll back with the\n"
                  "previous release tag rather than a revert commit.\n",
    "keys.md": "# Keys\n\nRotate the signing key every ninety days and after anyone with access leaves\n"
               "the team. The old key stays valid for one day so that running jobs can finish.\n",
    "golden.yaml": "- query_id: h1\n  kind: factual\n  query: How often is the signing key rotated?\n"
                   "  doc_id: keys\n  anchor: rotate the signing key every ninety days\n"
                   "- query_id: h2\n  kind: conceptual\n  query: What do we do when a release breaks production?\n"
                   "  doc_id: deploys\n  anchor: roll back with the previous release tag\n",
}
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}
# The asset graph draws bare name boxes below this zoom (AssetGraphExplorer's MINIMAL_SCALE is
# 0.6); the viewport is sized so that the graph, fitted to the width, stays just above it.
GRAPH_SCALE = 0.625
NAV_COLLAPSED = "localStorage.setItem('dagster-nav-collapsed', 'true')"
ERROR_TEXTS = ("Unexpected GraphQL error", "Something went wrong", "PythonError", "Error loading")


def log(msg: str) -> None:
    print(f"[screenshots {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class UI:
    """``python -m retrieval_assets.ui dev`` as a subprocess in its own process group."""

    def __init__(self, port: int, workdir: Path):
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.log_path = workdir / "ui.log"
        self.proc: subprocess.Popen | None = None
        self.location: str | None = None

    def start(self, timeout: float = 300) -> None:
        cmd = ["uv", "run", "python", "-m", "retrieval_assets.ui", "dev", "-p", str(self.port), "-h", "127.0.0.1"]
        log(f"starting the UI: {' '.join(cmd)} (log: {self.log_path})")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=default_signals)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the UI exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.base}/server_info", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no /server_info after {timeout:.0f}s:\n{self.tail()}")
            time.sleep(2)
        while True:  # the code location must be loaded before the schedule and assets exist
            entries = self.gql("{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
                               "locationOrLoadError { __typename ... on PythonError { message } } } } } }")
            entries = entries["workspaceOrError"].get("locationEntries") or []
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                bad = [e for e in entries if e["locationOrLoadError"]["__typename"] != "RepositoryLocation"]
                if bad:
                    raise RuntimeError(f"code location failed to load: {bad}")
                self.location = entries[0]["name"]
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"code location not loaded after {timeout:.0f}s")
            time.sleep(2)
        log(f"UI up at {self.base} (code location {self.location})")

    def up(self) -> bool:
        return self.location is not None and self.proc is not None and self.proc.poll() is None

    def gql(self, query: str, variables: dict | None = None) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"{self.base}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.load(r)
        if out.get("errors"):
            raise RuntimeError(f"GraphQL errors: {out['errors']}")
        return out["data"]

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session: the child leads its own process group
        for sig, wait in ((signal.SIGINT, 60), (signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            log(f"stopping the UI: {sig.name} to process group {pgid}")
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            deadline = time.monotonic() + wait  # dagster dev's children share the group
            while time.monotonic() < deadline and group_alive(pgid):
                time.sleep(0.5)
            if not group_alive(pgid):
                break
        self._log.close()


def default_signals() -> None:
    """In the UI's process: SIGINT and SIGTERM back to their defaults. A script started in the
    background of a non-interactive shell inherits SIGINT ignored, dagster dev copies that to
    SIGTERM, and it could then only be killed."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_command(cmd: list[str]) -> None:
    log(" ".join(cmd))
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {rc}")


def path(name: str, corpus: str = CORPUS) -> list[str]:
    """The asset key path of ``name`` in ``corpus``: ``["fixture", "eval_run"]``."""
    return [corpus, name]


# ---------------------------------------------------------------------------------- history

def trend_points(ui: UI, key: str = "hash/ndcg@k") -> int:
    data = ui.gql("""query($k: [String!]!) { assetOrError(assetKey: {path: $k}) {
        ... on Asset { assetMaterializations(limit: 500) { metadataEntries { label } } } } }""",
                  {"k": path("embedder_comparison")})
    mats = (data["assetOrError"] or {}).get("assetMaterializations") or []
    return sum(1 for m in mats if any(e["label"] == key for e in m["metadataEntries"]))


def top_up_history(ui: UI, min_points: int) -> int:
    have = trend_points(ui)
    launches = min(2, max(0, min_points - have - 1))  # the tick's hash run adds one point
    log(f"embedder_comparison has {have} materialisation(s) with hash/ndcg@k; "
        f"{launches} run(s) of the main command needed for {min_points} points")
    for i in range(launches):
        log(f"main command ({i + 1}/{launches}):")
        run_command(MAIN_COMMAND)
    return launches


# ---------------------------------------------------------------------------- second corpus

class SecondCorpus:
    """The throwaway corpus ``SECOND`` (three Markdown files and a golden set of two queries in a
    temporary folder) beside the fixture: registered, evaluated once, and removed again with
    everything it left: its schemas, history and stored values (``corpus remove``), its runs and
    asset events in the Dagster instance, its reports and its folder."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix=f"retrieval-{SECOND}-"))
        self.registered = False

    def register(self) -> None:
        for name, text in SECOND_FILES.items():
            (self.folder / name).write_text(text)
        run_command(["uv", "run", "python", "-m", "retrieval_assets", "corpus", "add", SECOND, str(self.folder)])
        self.registered = True

    def evaluate(self) -> None:
        run_command(["uv", "run", "dg", "launch", "--job", f"{JOB}__{SECOND}", "--partition", "hash"])

    def remove(self, ui: UI) -> None:
        try:
            if self.registered and ui.up():
                self._forget_runs(ui)
        finally:
            if self.registered:
                run_command(["uv", "run", "python", "-m", "retrieval_assets", "corpus", "remove", SECOND, "--yes"])
            shutil.rmtree(ROOT / ".retrieval" / "reports" / SECOND, ignore_errors=True)
            shutil.rmtree(self.folder, ignore_errors=True)

    def _forget_runs(self, ui: UI) -> None:
        """Wipe the corpus's assets and delete its runs (tag retrieval/corpus), once they have finished."""
        data = ui.gql("""{ runsOrError(filter: {tags: [{key: "retrieval/corpus", value: "%s"}]}) {
            ... on Runs { results { runId } } } }""" % SECOND)
        run_ids = [r["runId"] for r in data["runsOrError"]["results"]]
        if run_ids:
            wait_for_runs(ui, run_ids, 300)
        keys = [n["assetKey"] for n in ui.gql("{ assetNodes { assetKey { path } } }")["assetNodes"]
                if n["assetKey"]["path"][0] == SECOND]
        wiped = ui.gql("""mutation($r: [PartitionsByAssetSelector!]!) { wipeAssets(assetPartitionRanges: $r) {
            __typename ... on PythonError { message } } }""", {"r": [{"assetKey": k} for k in keys]})["wipeAssets"]
        if wiped["__typename"] != "AssetWipeSuccess":
            raise RuntimeError(f"wiping {SECOND}'s assets: {wiped}")
        for rid in run_ids:
            deleted = ui.gql("""mutation($id: String!) { deleteRun(runId: $id) { __typename
                ... on PythonError { message } } }""", {"id": rid})["deleteRun"]
            if deleted["__typename"] != "DeletePipelineRunSuccess":
                raise RuntimeError(f"deleting {SECOND}'s run {rid}: {deleted}")
            shutil.rmtree(ROOT / ".retrieval" / "dagster" / "logs" / rid, ignore_errors=True)
        log(f"{SECOND}: wiped {len(keys)} assets, deleted {len(run_ids)} runs")


# ------------------------------------------------------------------------------ schedule tick

def latest_tick(now: dt.datetime) -> dt.datetime:
    """The latest 03:00 UTC (the schedule's cron 0 3 * * *) at or before now."""
    tick = now.replace(hour=3, minute=0, second=0, microsecond=0)
    return tick if tick <= now else tick - dt.timedelta(days=1)


def tick_label(tick: dt.datetime) -> str:
    return f"{tick:%b} {tick.day}, {tick.hour % 12 or 12}:{tick:%M} {'AM' if tick.hour < 12 else 'PM'} UTC"


def dismiss_modals(page: Page) -> None:
    """The first visit shows a "Join the Dagster community" dialog: Skip it."""
    skip = page.get_by_role("dialog").get_by_role("button", name="Skip", exact=True)
    if skip.count() and skip.first.is_visible():
        skip.first.click()
        page.wait_for_timeout(500)


def launch_tick(ui: UI, page: Page, workdir: Path) -> list[str]:
    page.goto(f"{ui.base}/automation")
    link = page.locator(f'a[href$="/schedules/{SCHEDULE}"]')  # its name includes the cron text
    link.first.wait_for(timeout=60_000)
    page.wait_for_timeout(1000)
    dismiss_modals(page)
    link.first.click()
    page.wait_for_url(re.compile(rf"/schedules/{SCHEDULE}"), timeout=30_000)
    page.get_by_role("button", name="Preview tick result").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Select an evaluation time to simulate").wait_for(timeout=30_000)

    tick = latest_tick(dt.datetime.now(dt.timezone.utc))
    label = tick_label(tick)
    dialog.get_by_role("button", name=re.compile(r"UTC")).first.click()
    items = page.get_by_role("menuitem", name=label, exact=True)
    items.first.wait_for(timeout=10_000)
    items.first.click()
    page.wait_for_timeout(500)
    picked = dialog.get_by_role("button", name=re.compile(r"UTC")).first.inner_text().strip()
    if picked != label:
        raise RuntimeError(f"tick time {label!r} not selected (dialog shows {picked!r})")
    log(f"Preview tick result: evaluating {SCHEDULE} for the tick {label}")
    dialog.get_by_role("button", name="Continue", exact=True).click()

    result = dialog.get_by_text(re.compile(r"^Requested runs \(\d+\)$"))
    try:
        result.wait_for(timeout=180_000)
    except Exception:
        page.screenshot(path=str(workdir / "tick-result.png"))
        raise RuntimeError(f"the tick evaluation returned no run requests:\n{dialog.inner_text()}") from None
    page.wait_for_timeout(500)
    page.screenshot(path=str(workdir / "tick-result.png"))
    requested = int(re.search(r"\d+", result.inner_text()).group())
    log(f"the tick requested {requested} run(s); clicking 'Launch all & commit tick result'")
    t0 = time.time()
    dialog.get_by_role("button", name="Launch all & commit tick result").click()

    # The UI then opens the runs page filtered to the launched ids: ?q[]=id:<uuid>&q[]=...
    run_ids: list[str] = []
    try:
        page.wait_for_url(re.compile(r"/runs\?.*id%3A"), timeout=60_000)
        query = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
        run_ids = [v[3:] for v in query.get("q[]", []) if v.startswith("id:")]
    except Exception:
        pass
    if len(run_ids) != requested:  # fall back to the runs the schedule's tag names since t0
        data = ui.gql("""query($after: Float) { runsOrError(filter: {tags: [{key: "dagster/schedule_name",
            value: "%s"}], createdAfter: $after}) { ... on Runs { results { runId } } } }""" % SCHEDULE,
                      {"after": t0 - 5})
        run_ids = [r["runId"] for r in data["runsOrError"]["results"]]
    page.wait_for_timeout(1500)
    page.screenshot(path=str(workdir / "tick-launched.png"))
    if len(run_ids) != requested:
        raise RuntimeError(f"{requested} run(s) requested but {len(run_ids)} found: {run_ids}")
    return run_ids


def wait_for_runs(ui: UI, run_ids: list[str], timeout: float) -> dict[str, dict]:
    query = """query($ids: [String!]) { runsOrError(filter: {runIds: $ids}) { ... on Runs {
        results { runId status jobName tags { key value } } } } }"""
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    while True:
        runs = {r["runId"]: r for r in ui.gql(query, {"ids": run_ids})["runsOrError"]["results"]}
        for rid, r in runs.items():
            if seen.get(rid) != r["status"]:
                seen[rid] = r["status"]
                log(f"run {rid[:8]} (partition {partition_of(r)}): {r['status']}")
        if len(runs) == len(run_ids) and all(r["status"] in TERMINAL for r in runs.values()):
            return runs
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs not finished after {timeout:.0f}s: {seen}")
        time.sleep(5)


def latest_materialization(ui: UI, key: list[str]) -> dict | None:
    data = ui.gql("""query($k: [String!]!) { assetOrError(assetKey: {path: $k}) { ... on Asset {
        assetMaterializations(limit: 1) { runId timestamp partition } } } }""", {"k": key})
    mats = (data["assetOrError"] or {}).get("assetMaterializations") or []
    return mats[0] if mats else None


def wait_for_eval_trend(ui: UI, corpus: str, timeout: float) -> str:
    """A corpus's eval_trend (group <corpus>_reports) is refreshed after its eval_run by its
    reports_after_evaluation sensor under the daemon: wait until its latest materialisation is
    newer than eval_run's and return the run that made it."""
    deadline = time.monotonic() + timeout
    evaluated = float(latest_materialization(ui, path("eval_run", corpus))["timestamp"])
    while True:
        trend = latest_materialization(ui, path("eval_trend", corpus))
        if trend and float(trend["timestamp"]) > evaluated:
            run = ui.gql("""query($id: ID!) { runOrError(runId: $id) { ... on Run { runId jobName
                tags { key value } } } }""", {"id": trend["runId"]})["runOrError"]
            by = next((t["value"] for t in run["tags"] if t["key"] in
                       ("dagster/sensor_name", "dagster/schedule_name")), "hand")
            log(f"{corpus}/eval_trend refreshed by run {trend['runId'][:8]} ({run['jobName']}, launched by {by})")
            return trend["runId"]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{corpus}/eval_trend not refreshed {timeout:.0f}s after its latest eval_run")
        time.sleep(5)


def asset_groups(ui: UI) -> dict[str, list[str]]:
    """Every asset group and the names (last key part) of its assets."""
    groups: dict[str, list[str]] = {}
    for n in ui.gql("{ assetNodes { assetKey { path } groupName } }")["assetNodes"]:
        groups.setdefault(n["groupName"], []).append(n["assetKey"]["path"][-1])
    return groups


def partition_of(run: dict) -> str:
    return next((t["value"] for t in run["tags"] if t["key"] == "dagster/partition"), "-")


# ------------------------------------------------------------------------------- screenshots

def new_page(browser, width: int, height: int, scale: float = 1) -> Page:
    context = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=scale)
    context.add_init_script(NAV_COLLAPSED)
    return context.new_page()


def check_clean(page: Page, what: str) -> None:
    text = page.inner_text("body")
    bad = [t for t in ERROR_TEXTS if t in text]
    if bad:
        raise RuntimeError(f"{what}: the page shows {bad}")


def shoot_graph(ui: UI, browser, out: Path, assets: list[str]) -> None:
    url = f"{ui.base}/locations/{ui.location}/asset-groups/{GROUP}/lineage"
    width, height = 1700, 1350
    for _attempt in range(3):
        page = new_page(browser, width, height, scale=2)
        page.goto(url)
        page.locator("foreignObject").nth(len(assets) - 1).wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        dismiss_modals(page)
        svg_w, svg_h, canvas = page.evaluate("""() => {
            const svg = [...document.querySelectorAll('svg')].find(s => s.querySelector('foreignObject'));
            const box = svg.parentElement.parentElement.getBoundingClientRect();
            return [+svg.getAttribute('width'), +svg.getAttribute('height'), box.toJSON()]; }""")
        # The graph is fitted to the canvas width (zoom-to-fit-width) and centred vertically:
        # size the viewport so that the fitted scale draws detailed nodes and the height fits.
        want_w = max(1600, canvas["x"] + math.ceil(svg_w * GRAPH_SCALE) + 4)
        scale = min(1.0, (want_w - canvas["x"]) / svg_w)
        want_h = max(900, canvas["y"] + math.ceil(svg_h * scale) + 40)
        if abs(want_w - width) <= 8 and abs(want_h - height) <= 8:
            break
        page.context.close()
        width, height = int(want_w), int(want_h)
        log(f"asset graph {svg_w:.0f}x{svg_h:.0f}: viewport {width}x{height}")
    else:
        raise RuntimeError("asset graph: could not size the viewport")
    for name in assets:
        page.locator("foreignObject", has_text=name).first.wait_for(timeout=30_000)
    page.get_by_text("Latest event").first.wait_for(timeout=30_000)
    # live data (statuses, partition counts) arrives after the layout, later on a loaded machine: wait until no node
    # says "Loading" and the partitioned nodes show how filled they are
    loading = page.locator("foreignObject").get_by_text(re.compile(r"^\s*Loading"))
    for _ in range(90):
        if not loading.count() and page.get_by_text(re.compile(r"% filled")).count():
            break
        page.wait_for_timeout(1000)
    else:
        raise RuntimeError("asset graph: the nodes' live data was still loading after 90 s")
    page.wait_for_timeout(1500)
    if page.locator("[class*=minimalAssetNode]").count():
        raise RuntimeError("asset graph: nodes drawn minimal (zoom below the detail threshold)")
    check_clean(page, "asset graph")
    page.screenshot(path=str(out))
    page.context.close()


def shoot_eval_run(ui: UI, browser, out: Path, hash_run: str | None) -> None:
    page = new_page(browser, 1600, 1000)
    page.goto(f"{ui.base}/assets/{CORPUS}/eval_run?view=partitions&partition=hash")
    page.get_by_text("Latest materialization").first.wait_for(timeout=60_000)
    for key in ("recall@k", "mrr", "ndcg@k"):
        page.get_by_role("cell", name=key, exact=True).first.wait_for(timeout=30_000)
    page.wait_for_timeout(2000)
    dismiss_modals(page)
    keys = page.locator("table").last.locator("tr td:first-child").all_inner_texts()
    if keys[:3] != ["recall@k", "mrr", "ndcg@k"]:
        raise RuntimeError(f"eval_run: headline keys not first: {keys[:5]}")
    if hash_run and hash_run[:8] not in page.inner_text("body"):
        log(f"warning: eval_run[hash]'s latest materialisation is not from the tick's run {hash_run[:8]}")
    check_clean(page, "eval_run")
    page.screenshot(path=str(out))
    page.context.close()


def shoot_embedder_trend(ui: UI, browser, out: Path) -> None:
    width = 1600
    page = new_page(browser, width, 1000)
    page.goto(f"{ui.base}/assets/{CORPUS}/embedder_comparison")
    page.get_by_role("button", name="Plots").wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    dismiss_modals(page)
    page.get_by_role("button", name="Plots").click()
    first, last = "hash/ndcg@k", "minilm/ndcg@k"
    for key in (first, last):
        page.get_by_text(key, exact=True).first.wait_for(timeout=30_000)

    def region() -> dict:
        """Content offsets (in the scrolling left column) of the two plots and the toggle."""
        return page.evaluate("""([first, last]) => {
            const title = k => [...document.querySelectorAll('span')].find(s => s.innerText === k);
            const plot = k => { let e = title(k); while (e && !e.querySelector('canvas')) e = e.parentElement; return e; };
            const t = title(first);
            let sc = t; while (sc && !(sc.scrollHeight > sc.clientHeight + 10 && getComputedStyle(sc).overflowY !== 'visible')) sc = sc.parentElement;
            const top0 = sc.getBoundingClientRect().top - sc.scrollTop;
            const toggle = [...document.querySelectorAll('button')].find(b => b.innerText.trim() === 'Table');
            const rect = e => e.getBoundingClientRect();
            return {top: rect(plot(first)).top - top0, bottom: rect(plot(last)).bottom - top0,
                    toggle: rect(toggle).top - top0, header: rect(sc).top, right: rect(sc).right,
                    canvases: [plot(first), plot(last)].map(p => p.querySelector('canvas').width)};
        }""", [first, last])

    r = region()
    top = r["toggle"] - 16 if r["bottom"] - r["toggle"] <= 1500 else r["top"] - 12
    height = int(r["header"] + (r["bottom"] - top) + 6)
    page.set_viewport_size({"width": width, "height": max(height, 600)})
    page.wait_for_timeout(1000)
    r = region()
    top = r["toggle"] - 16 if r["bottom"] - r["toggle"] <= 1500 else r["top"] - 12
    page.evaluate("""([first, top]) => {
        let sc = [...document.querySelectorAll('span')].find(s => s.innerText === first);
        while (sc && !(sc.scrollHeight > sc.clientHeight + 10 && getComputedStyle(sc).overflowY !== 'visible')) sc = sc.parentElement;
        sc.scrollTop = top; }""", [first, top])
    page.wait_for_timeout(2500)  # charts draw (and animate) once scrolled into view
    if not all(r["canvases"]):
        raise RuntimeError("embedder_comparison: a plot did not draw")
    check_clean(page, "embedder_comparison")
    size = page.viewport_size
    page.screenshot(path=str(out), clip={"x": 0, "y": 0, "width": r["right"], "height": size["height"]})
    page.context.close()


def shoot_eval_trend(ui: UI, browser, out: Path, trend_run: str) -> None:
    page = new_page(browser, 1600, 1000)
    page.goto(f"{ui.base}/assets/{CORPUS}/eval_trend?view=events")
    page.get_by_text("[Show Markdown]").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    dismiss_modals(page)
    shown = page.get_by_text("Materialized in run").first.inner_text()
    if trend_run[:8] not in shown:
        log(f"warning: eval_trend's latest materialisation ({shown}) is not from run {trend_run[:8]}")
    check_clean(page, "eval_trend")
    page.get_by_role("row").filter(has=page.get_by_role("cell", name="plot", exact=True)) \
        .get_by_text("[Show Markdown]").click()
    dialog = page.get_by_role("dialog")
    dialog.locator("img").first.wait_for(timeout=30_000)
    page.wait_for_function("() => { const i = document.querySelector('[role=dialog] img'); "
                           "return i && i.complete && i.naturalWidth > 0; }", timeout=30_000)
    page.wait_for_timeout(1000)
    page.screenshot(path=str(out))
    page.context.close()


def shoot_corpora(ui: UI, browser, out: Path, groups: list[str]) -> None:
    """The global lineage, groups collapsed (its default with several groups): each corpus's chain
    of groups, and the sidebar's list of every group."""
    page = new_page(browser, 1360, 860)
    page.goto(f"{ui.base}/asset-groups")
    page.get_by_text("Global asset lineage").first.wait_for(timeout=60_000)
    for group in groups:  # a collapsed group's box reads "<group><status counts>"
        page.locator("foreignObject", has_text=re.compile(rf"^{group}(?![a-z_])")).first.wait_for(timeout=60_000)
    page.wait_for_timeout(4000)  # live data (statuses) arrives after the layout
    dismiss_modals(page)
    check_clean(page, "global lineage")
    page.screenshot(path=str(out))
    page.context.close()


# ------------------------------------------------------------------------------------ main

def group_status(ui: UI, names: list[str]) -> list[str]:
    query = """query($k: [String!]!) { assetOrError(assetKey: {path: $k}) { ... on Asset {
        assetMaterializations(limit: 1) { runId }
        definition { isPartitioned assetPartitionStatuses { ... on DefaultPartitionStatuses {
            materializedPartitions failedPartitions unmaterializedPartitions } } } } } }"""
    lines = []
    for name in names:
        a = ui.gql(query, {"k": path(name)})["assetOrError"]
        mats = a.get("assetMaterializations") or []
        if a["definition"]["isPartitioned"]:
            s = a["definition"]["assetPartitionStatuses"]
            lines.append(f"{CORPUS}/{name}: materialized {s['materializedPartitions']}, missing "
                         f"{s['unmaterializedPartitions']}, failed {s['failedPartitions']}")
        else:
            lines.append(f"{CORPUS}/{name}: {'materialized' if mats else 'never materialized'}"
                         + (f" (latest run {mats[0]['runId'][:8]})" if mats else ""))
    return lines


def dagster_dirs() -> dict[Path, set[str] | None]:
    """What DAGSTER_DIRS hold now (None: the folder does not exist)."""
    return {d: ({p.name for p in d.iterdir()} if d.is_dir() else None) for d in DAGSTER_DIRS}


def clean_dagster_dirs(before: dict[Path, set[str] | None]) -> None:
    """Remove the files the webserver created in DAGSTER_DIRS, and the folders it created."""
    for d, had in before.items():
        if not d.is_dir():
            continue
        for p in d.iterdir():
            if (had is None or p.name not in had) and p.is_file():
                p.unlink()
        if had is None and not any(d.iterdir()):
            d.rmdir()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0, help="UI port (default: a free one)")
    ap.add_argument("--min-points", type=int, default=3,
                    help="embedder_comparison materialisations with hash/ndcg@k wanted after the tick")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for the tick's runs")
    args = ap.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="retrieval-screenshots-"))
    dirs_before = dagster_dirs()
    ui = UI(args.port or free_port(), workdir)
    second = SecondCorpus()
    ok = False
    try:
        second.register()  # before the UI starts, so that its code location loads both corpora
        ui.start()
        top_up_history(ui, args.min_points)
        second.evaluate()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
            page = new_page(browser, 1600, 1000)
            run_ids = launch_tick(ui, page, workdir)
            page.context.close()
            log(f"tick launched {len(run_ids)} run(s): {', '.join(r[:8] for r in run_ids)}")
            runs = wait_for_runs(ui, run_ids, args.timeout)
            failed = {rid[:8]: r["status"] for rid, r in runs.items() if r["status"] != "SUCCESS"}
            if failed:
                raise RuntimeError(f"tick runs did not succeed: {failed} (see the UI log {ui.log_path})")
            by_partition = {partition_of(r): rid for rid, r in runs.items()}
            log("tick runs succeeded: " + ", ".join(f"{k} {v[:8]}" for k, v in sorted(by_partition.items())))
            trend_run = wait_for_eval_trend(ui, CORPUS, 600)
            wait_for_eval_trend(ui, SECOND, 600)
            groups = asset_groups(ui)
            assets = groups[GROUP]
            log(f"asset group {GROUP}: {', '.join(assets)}")
            corpus_groups = [g for c in (CORPUS, SECOND) for g in (c, f"{c}_reports", f"{c}_experiments", f"{c}_live")]
            if missing := [g for g in corpus_groups if g not in groups]:
                raise RuntimeError(f"asset groups missing: {missing} (groups: {sorted(groups)})")

            shots = [("asset-graph.png", lambda o: shoot_graph(ui, browser, o, assets)),
                     ("eval-run.png", lambda o: shoot_eval_run(ui, browser, o, by_partition.get("hash"))),
                     ("embedder-trend.png", lambda o: shoot_embedder_trend(ui, browser, o)),
                     ("eval-trend.png", lambda o: shoot_eval_trend(ui, browser, o, trend_run)),
                     ("corpora.png", lambda o: shoot_corpora(ui, browser, o, corpus_groups))]
            for name, shoot in shots:
                tmp = workdir / name
                shoot(tmp)
                shutil.copyfile(tmp, DOCS / name)
                log(f"wrote docs/{name}")
            browser.close()
        for line in group_status(ui, assets + [a for a in ("eval_trend",) if a not in assets]):
            log(line)
        ok = True
    finally:
        try:
            second.remove(ui)
        finally:
            ui.stop()
            clean_dagster_dirs(dirs_before)
        if ok:
            log(f"done; the UI log and the tick dialog screenshots are in {workdir}")
        else:
            log(f"FAILED; the UI log and step screenshots are in {workdir}\n{ui.tail(20)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
