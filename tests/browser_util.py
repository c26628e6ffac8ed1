"""Shared by the browser tests: one Streamlit server for all of them, Debian's Chromium through Playwright.

Import the fixtures into a test module (`from browser_util import browser, page, server  # noqa: F401`); all are
module-scoped, but Chromium and the server are started by the first module that asks for them and stopped before
the process's first test that needs neither (every page has a context of its own, every visitor a session; a fresh
server per module only repeated its warm-up).
Never `playwright install`: the tests drive /usr/bin/chromium and are skipped where it is missing.
"""
from __future__ import annotations

import atexit
import base64
import itertools
import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from explorer_model.cli.serve import free_port  # noqa: F401  (the test modules import it from here)

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run",
         # V8's baseline compiler only: a test page lives for a few script runs, and the optimizing compilers
         # (Maglev, TurboFan) compile the same functions again for every page, on background threads, for runs
         # that never come (the browser modules: ~6 % less of Chromium's CPU, docs/testing.md). The bench/
         # scripts, which measure what a visitor's browser does, keep V8's defaults.
         "--js-flags=--max-opt=1"]
# the machine is shared by many processes on 2 cores: a script run may take a minute
RUN_TIMEOUT = 180_000

if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


_SHARED: dict = {}  # "app": the running server's URL, "stop": what ends it


@pytest.fixture(scope="module")
def server():
    """The app's URL, served the way `llama-explorer serve` serves it (explorer_model.cli.serve.streamlit_command); one
    server for this process's browser modules, stopped before its first test that needs none or at the session's
    end (conftest.py). (The browser modules go first: tests/module_order.py.)"""
    if "app" not in _SHARED:
        _SHARED["app"], _SHARED["stop"] = _start_server()
        atexit.register(stop_server)  # the run ends abruptly: do not leave the server behind
    yield _SHARED["app"]


def stop_server() -> None:
    stop = _SHARED.pop("stop", None)
    _SHARED.pop("app", None)
    if stop:
        stop()


def _start_server():
    from explorer_model.cli.serve import streamlit_command

    port = free_port()
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"llama_explorer_browser_{port}.log", "w+b")
    proc = subprocess.Popen(streamlit_command(port), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=5).read() == b"ok":
                break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        log.seek(0)
        pytest.fail("the Streamlit server did not start: " + log.read().decode(errors="replace")[-2000:])
    app = AppURL(url)
    app.log = _ServerLog(log)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        Path(log.name).unlink(missing_ok=True)  # its tail went into any failure message already
    return app, stop


class AppURL(str):
    """The server's base URL; .log.tail() is what the server printed."""


class _ServerLog:
    """The server's output so far, for failure messages (e.g. a MediaFileStorageError behind a dead download)."""

    def __init__(self, handle):
        self.handle = handle

    def tail(self, n: int = 1500) -> str:
        self.handle.flush()
        with open(self.handle.name, "rb") as f:
            return f.read().decode(errors="replace")[-n:]


@pytest.fixture(scope="module")
def browser():
    """Chromium, launched by the first module that asks for it and shared by the next ones in this process (each
    module's pages have contexts of their own; a launch and Playwright's driver cost ~2 s of CPU); closed before
    the first test that drives no browser or at the session's end (conftest.py)."""
    if "browser" not in _SHARED:
        playwright = sync_api.sync_playwright().start()
        _SHARED["browser"] = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        _SHARED["playwright"] = playwright
    yield _SHARED["browser"]


def stop_browser() -> None:
    """Close the shared Chromium, if running (conftest.py: before a test that drives none, at the session's end)."""
    browser, playwright = _SHARED.pop("browser", None), _SHARED.pop("playwright", None)
    _SHARED.pop("pages", None)
    if browser:
        browser.close()
        playwright.stop()


@pytest.fixture(scope="module")
def page(browser):
    """One 1500×1100 page for the module's tests (they run in order, each opening the URL it needs)."""
    pg = module_page(browser, 1500, 1100)
    yield pg
    forget(pg)


def module_page(browser, width: int = 1500, height: int = 1100, **context):
    """A page for a module whose tests use one page at a time: this process's page for these context options (a
    desktop's, a phone's), sized width × height and holding nothing of the module before it (forget). A page load
    in a page that has loaded the app before costs the browser about a third of one in a new context, which has a
    cache of its own: every script fetched and compiled again (bench/bench_page_load.py, docs/testing.md)."""
    pages = _SHARED.setdefault("pages", {})
    key = tuple(sorted(context.items()))
    pg = pages.get(key)
    if pg is None or pg.is_closed():
        pg = pages[key] = new_page(browser, width, height, **context)
    else:
        forget(pg)
        pg.set_viewport_size({"width": width, "height": height})
    return pg


def forget(pg) -> None:
    """Leave the app (its session ends) and clear what it keeps in the browser: the screen cookie, Streamlit's
    sidebar state in localStorage, the requests seen; the page's next module starts as a new context would."""
    if pg.url.startswith("http"):
        pg.evaluate("() => { localStorage.clear(); sessionStorage.clear(); }")
    pg.goto("about:blank")
    pg.context.clear_cookies()
    pg.requests.clear()


def new_page(browser, width: int = 1500, height: int = 1100, **kwargs):
    """A page in its own context (own downloads, own Streamlit session); requests are recorded in pg.requests."""
    ctx = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True, **kwargs)
    ctx.set_default_timeout(RUN_TIMEOUT)
    ctx.add_init_script(COUNT_RUNS)
    pg = ctx.new_page()
    requests: list[str] = []
    pg.on("request", lambda r: requests.append(r.url))
    pg.requests = requests
    return pg


def another_page(pg):
    """A second page in pg's context, the same size: its own Streamlit session, pg's cookies and cache."""
    other = pg.context.new_page()
    other.set_viewport_size(pg.viewport_size)
    requests: list[str] = []
    other.on("request", lambda r: requests.append(r.url))
    other.requests = requests
    return other


def shots_dir() -> Path:
    d = Path(os.environ.get("SCREENSHOT_DIR", ROOT / "artifacts" / "screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


SCRIPT_STATE = "document.querySelector('[data-testid=\"stApp\"]')?.getAttribute('data-test-script-state')"
# Every page counts the script runs it has seen start (window.__stRuns, per document __stDoc): a run that began and
# ended between an action and wait_idle's first look is still seen, instead of waiting out `started_within`.
COUNT_RUNS = """(() => {
    window.__stDoc = Math.random();
    window.__stRuns = 0;
    new MutationObserver(records => {
        records.forEach((r, i) => {
            const now = i + 1 < records.length && records[i + 1].target === r.target ? records[i + 1].oldValue
                : r.target.getAttribute('data-test-script-state');
            if (r.target.getAttribute('data-testid') === 'stApp' && now === 'running' && r.oldValue !== 'running')
                window.__stRuns++;
        });
    }).observe(document, {subtree: true, attributes: true, attributeOldValue: true,
                          attributeFilter: ['data-test-script-state']});
})()"""
RUN_SEEN = "() => [window.__stDoc, window.__stRuns]"


def wait_idle(pg, timeout=RUN_TIMEOUT, started_within: int = 5_000):
    """Wait for the script run an action started to finish (stApp's data-test-script-state; the status widget is
    hidden by --client.toolbarMode minimal). On a busy machine the rerun may begin late: first wait up to
    `started_within` ms for it to start (a run that already finished counts as started: COUNT_RUNS)."""
    if started_within:  # 0: the caller knows the run has started (its output is on the page)
        doc, seen = getattr(pg, "runs_seen", (None, 0))
        try:
            pg.wait_for_function(f"([doc, seen]) => {SCRIPT_STATE} === 'running' || "
                                 "window.__stRuns > (window.__stDoc === doc ? seen : 0)", arg=[doc, seen],
                                 timeout=started_within)
        except sync_api.TimeoutError:
            pass
    steady(pg, f"{SCRIPT_STATE} !== 'running' && !document.querySelector('[data-testid=\"stStatusWidget\"]') && "
               "String(window.__stRuns)", 150, timeout)  # a follow-up run (st.rerun) restarts the count
    pg.runs_seen = tuple(pg.evaluate(RUN_SEEN))


_STEADY = itertools.count()


def steady(pg, condition: str, ms: int, timeout=RUN_TIMEOUT) -> None:
    """Wait until the JS expression `condition` has given the same truthy value for `ms` ms on end (checked every
    50 ms): a page still changing restarts the count, where a fixed sleep could read it mid-change. (Checked every
    animation frame, the default, the wait itself kept the page drawing frames: ~6% more of Chromium's CPU over a
    walk through the views.)"""
    key = f"__steady{next(_STEADY)}"
    pg.wait_for_function(f"""() => {{ const now = performance.now(), v = ({condition});
        const s = window.{key};
        if (!v) {{ window.{key} = undefined; return false; }}
        if (!s || s.v !== v) {{ window.{key} = {{v, t: now}}; return false; }}
        return now - s.t >= {ms}; }}""", timeout=timeout, polling=50)


def open_app(pg, server: str, **params) -> None:
    """Open the app with these query parameters and wait until the script has run (the sidebar's prompt box)."""
    pg.goto(server + "/?" + urllib.parse.urlencode(params), wait_until="domcontentloaded")
    pg.wait_for_selector('[data-testid="stSidebar"] textarea, [data-testid="stMain"] .js-plotly-plot',
                         state="attached", timeout=RUN_TIMEOUT)
    wait_idle(pg, started_within=0)  # the first run's output is on the page: it has started


def set_prompt(pg, text: str) -> None:
    box = pg.locator('[data-testid="stSidebar"] textarea').first
    box.fill(text)
    box.press("Control+Enter")
    wait_idle(pg)


def view_buttons(pg):
    return pg.locator('[data-testid="stMain"] [data-testid="stButtonGroup"]').first.locator("button")


def view_labels(pg) -> list[str]:
    """The view selector's labels as the page shows them (in its language), once the selector is drawn."""
    view_buttons(pg).first.wait_for(state="attached", timeout=RUN_TIMEOUT)
    return [t.strip() for t in view_buttons(pg).all_inner_texts()]


def pick_view(pg, label: str):
    button = pg.locator('[data-testid="stButtonGroup"]').get_by_text(label, exact=True).first
    # the selector is a required radio group: a click on the view already shown changes nothing and starts no
    # script run, so there is no run to wait 5 s for
    shown = button.evaluate("b => b.closest('[role=radio]')?.getAttribute('aria-checked') === 'true'")
    button.click()
    wait_idle(pg, started_within=0 if shown else 5_000)


def each_view(pg):
    """Click through the view selector; yields (label, view key from the URL) after each view has drawn."""
    for label in view_labels(pg):
        pick_view(pg, label)
        settle_figures(pg)
        yield label, query(pg).get("view", "")


def settle_figures(pg) -> None:
    """Let Plotly finish drawing every figure of the page (its component loads lazily: a skeleton stands in)."""
    steady(pg, """!document.querySelector('[data-testid="stSkeleton"]') &&
        [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].every(c => {
            const el = c.querySelector('.js-plotly-plot');
            return el && el._fullLayout && el.querySelector('.main-svg'); }) &&
        [...document.querySelectorAll('.js-plotly-plot')].map(el => el._fullLayout &&
            [el._fullLayout.width, el._fullLayout.height, el.data.length, el.querySelectorAll('.main-svg').length]
        ).join('|') + '#'
        """, 250)  # drawn, and no figure still changing size or content


def query(pg) -> dict[str, str]:
    return {k: v[-1] for k, v in urllib.parse.parse_qs(urllib.parse.urlparse(pg.url).query).items()}


def view_errors(pg) -> list[str]:
    """Texts of exceptions and error boxes in the page (a view that failed)."""
    return pg.locator('[data-testid="stException"], [data-testid="stAlertContentError"]').all_inner_texts()


def figures(pg, scope: str = '[data-testid="stMain"]') -> list[dict]:
    """Every Plotly figure of the page as {"data": [...], "layout": {...}} (typed arrays as lists), in page order."""
    raw = pg.evaluate("""scope => {
        const plain = v => (ArrayBuffer.isView(v) ? Array.from(v) : Array.isArray(v) ? v.map(plain) :
            (v && typeof v === 'object') ? Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)])) : v);
        return JSON.stringify([...document.querySelectorAll(scope + ' .js-plotly-plot')].map(el => ({
            data: plain(el.data.map(t => Object.fromEntries(Object.entries(t).filter(([k]) => !k.startsWith('_'))))),
            layout: plain(Object.fromEntries(Object.entries(el.layout).filter(([k]) => !k.startsWith('_')))),
        })));
    }""", scope)
    return decode_arrays(json.loads(raw))


def decode_arrays(obj):
    """Plotly's typed-array form {"dtype", "bdata", "shape"} (base64) as nested lists, the rest unchanged."""
    if isinstance(obj, dict) and "bdata" in obj and "dtype" in obj:
        import numpy as np

        a = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=np.dtype(obj["dtype"]))
        shape = obj.get("shape")
        if shape:
            a = a.reshape([int(v) for v in str(shape).split(",")] if isinstance(shape, str) else shape)
        return [None if v != v else v for v in a.tolist()] if a.ndim == 1 else \
            [[None if v != v else v for v in row] for row in a.tolist()]
    if isinstance(obj, dict):
        return {k: decode_arrays(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_arrays(v) for v in obj]
    return obj


def strings(obj):
    """Every string inside a JSON value."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from strings(v)


BYTE_ESCAPE = re.compile(r"\\x[0-9a-fA-F]{2}|<0x[0-9a-fA-F]{2}>")


def garbled(text: str) -> list[str]:
    """Byte escapes (\\xe6, <0xE6>) and U+FFFD in text, with a little context each."""
    hits = [m.start() for m in BYTE_ESCAPE.finditer(text)] + [i for i, c in enumerate(text) if c == "\ufffd"]
    return [text[max(0, i - 20):i + 20] for i in sorted(hits)]


# --------------------------------------------------------------------------- shared by the classroom checks
PROMPT = "The animal didn't cross the street because it was too tired."
# views whose main figure must be on a projector's first screen (the labs start from a button)
CORE_VIEWS = ("tokens", "attention", "norm", "rope", "swiglu", "residual", "predict", "block")
EXPANDERS = '[data-testid="stMain"] [data-testid="stExpander"] details:not([open]) > summary'


# what unfolding changes: open explanations, the main area's size, formulas drawn, fonts loaded
LAYOUT = """(() => { const m = document.querySelector('[data-testid="stMain"]');
    return [m.querySelectorAll('details[open]').length, m.scrollHeight, m.scrollWidth,
            m.querySelectorAll('.katex').length, document.fonts.status].join('|'); })()"""


def open_expanders(pg) -> None:
    """Unfold every explanation (client side only: no script run), so what is inside is checked too; returns once
    the layout has held still (steady) rather than after a fixed pause."""
    for s in pg.locator(EXPANDERS).all():
        if s.is_visible():
            s.click()
    steady(pg, LAYOUT, 200)


def each_view_drawn(pg):
    """each_view, with the what-if view showing a comparison (its figures and downloads appear only after one is
    chosen: the "no causal mask" quick button, found by its widget key, whatever the language)."""
    for label, view in each_view(pg):
        if view == "whatif" and not pg.locator('[data-testid="stMain"] .js-plotly-plot').count():
            pg.locator(".st-key-whatif_q_mask button").click()
            wait_idle(pg)
            settle_figures(pg)
        yield label, view


def download(pg, click, what: str, server) -> tuple[str, bytes]:
    """(file name, bytes) of the download a click starts; an assertion naming what was clicked if none arrives."""
    try:
        with pg.expect_download(timeout=120_000) as info:
            click()
    except Exception as e:  # noqa: BLE001  (Playwright's TimeoutError; the message says what was clicked)
        raise AssertionError(f"clicking {what} delivered no file within 120 s ({type(e).__name__}); server log "
                             f"ends: {server.log.tail(600)}") from None
    d = info.value
    assert d.failure() is None, f"{what}: the download failed: {d.failure()}"
    with open(d.path(), "rb") as f:
        return d.suggested_filename, f.read()
