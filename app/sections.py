"""A view's sections, and landing on one: a preset, a lecture step, a link (`section=`) or a button that is about one
part of a view opens the view with that part in the first screen.

Each view draws its parts inside `section(view, key)` containers, in the order of SECTIONS; a container's key gives
its element a class the page can find (`st-key-section_{view}_{key}`). `request` (in a callback, or before the
widgets exist) names the part to land on, or the top of the page; `landing` puts a script on the page that scrolls
the main area as little as brings the whole part into the first screen (its top first, when it is taller than the
screen: what is above it stays in view when there is room; a lecture's player, pinned under the page's header, is
counted as covering the top; an element that would stand half under the header or the player is scrolled past
whole), and holds it there while figures above it still settle and the page runs again for its screen (on a slow
device, up to a minute after the run), until the visitor scrolls, clicks or types. Each request carries a number,
so a page run that only redraws never scrolls. A lecture step about no part lands on its view's first part, the main
figure.

A page that shows a comparison of A and B (app/compare.py) and names no part lands on the comparison's figures
(COMPARISON), not on the top of the page, where the lesson's sentence, the view selector and the comparison's
heading would fill a projector's first screen.

A page can show one part of its view alone (`only`): a following student's page in a room does, since the step's
part is what the class looks at, and every other part would be drawn again by the server and by each student's
phone at every step.

State (st.session_state): section  the part the link names (app/url_state.py writes it while it is the view's);
_landing  the number of the latest request; _only  (view, part) while a run shows that part alone; _section_note
(view, part, text) a lesson's sentence until that part is drawn (lesson_note); _unsent  while
it draws a part above that one; _whole  whether a following page showed whole views at its last run.
"""
from __future__ import annotations

import contextlib
import json

import streamlit as st

# Every view's parts, in page order (the first is the view's main figure).
SECTIONS: dict[str, tuple[str, ...]] = {
    "tokens": ("pieces", "embedding", "shapes", "params", "memory", "costs"),
    "attention": ("head", "grid", "link", "heads", "scale", "overview"),
    "norm": ("divisors", "final", "vectors", "gamma", "layernorm"),
    "rope": ("angles", "theta", "pairs", "shift", "decay", "clock", "sinusoidal"),
    "swiglu": ("heatmap", "silu", "token", "gates", "positionwise", "bank"),
    "residual": ("norms", "contributions", "lens"),
    "predict": ("loss", "sampling"),
    "block": ("diagram", "code", "model", "changes", "flow"),
    "whatif": ("choose", "results", "sweep"),
    "normlab": ("twins", "init", "depth", "race"),
}

# Parts that stand side by side on a wide screen (stacked on a phone), each landed on by itself: a page that shows
# one of them alone (`only`) shows both, since either alone would leave half a laptop's screen empty.
BESIDE: dict[str, tuple[str, ...]] = {"block": ("diagram", "code")}

COMPARISON = "compare_figures"  # the container of a comparison's figures


def css_key(view: str, key: str) -> str:
    return f"section_{view}_{key}"


def section(view: str, key: str):
    """The container one part of a view is drawn in (`with sections.section("residual", "lens"): …`)."""
    if key not in SECTIONS[view]:
        raise KeyError(f"{view} has no section {key!r}")
    shown = st.session_state.get("_only")
    alone = _alone(view, shown[1]) if shown and shown[0] == view else None
    if alone and SECTIONS[view].index(key) > max(SECTIONS[view].index(k) for k in alone):
        raise Rest(view)
    box = _noted(st.container(key=css_key(view, key)), view, key)
    return box if alone is None or key in alone else _unsent(box)


def comparison(view: str):
    """The container of a comparison's figures (where a page that shows one lands), with the lesson's sentence at
    its top."""
    return _noted(st.container(key=COMPARISON), view, COMPARISON)


def _noted(box, view: str, key: str):
    """`box` with the lesson's sentence at its top when the sentence waits for this part (lesson_note)."""
    note = st.session_state.get("_section_note")
    if note and note[:2] == (view, key):
        box.info(note[2], icon=None)
        st.session_state.pop("_section_note")
    return box


def _alone(view: str, key: str) -> tuple[str, ...]:
    """The parts a page that shows `key` alone draws: it, and the part it stands beside (BESIDE)."""
    beside = BESIDE.get(view, ())
    return beside if key in beside else (key,)


@contextlib.contextmanager
def lesson_note(view: str, text: str | None, part: str | None = None, comparing: bool = False):
    """A lesson's sentence over the view drawn inside this block: at the top of `part`, the part whose figure it
    is about (its preset's), else of the part the page lands on (the landing scrolls to that part: a sentence over
    the view's top would be off the screen), at the top of a comparison's figures when `comparing` (the page lands
    there), or over the view when the page is about no part of it, or the run drew no such part (B could not be
    run). (A lecture step may land on another part than its lesson's: "look for the diagonal stripe" stays by the
    map that has it.)"""
    if text is None:
        yield
        return
    ss, key = st.session_state, COMPARISON if comparing else part if valid(view, part) else current(view)
    slot = st.empty()
    if key is None:
        slot.info(text, icon=None)
        yield
        return
    ss["_section_note"] = (view, key, text)
    try:
        yield
    finally:
        if ss.pop("_section_note", None) is not None:
            slot.info(text, icon=None)


class Rest(Exception):
    """The parts of a view below the one a page shows alone (`only`) are left out."""


@contextlib.contextmanager
def only(view: str, on: bool):
    """While `on`, the page shows only `view`'s current part (its first, the main figure, when none is named): the
    parts above it are worked out but not sent (their containers stay, empty), and the next part's `section` raises
    Rest, which the caller catches after this block."""
    ss = st.session_state
    if on:
        ss["_only"] = (view, current(view) or SECTIONS[view][0])
    try:
        yield
    finally:
        ss.pop("_only", None)


@contextlib.contextmanager
def _unsent(box):
    """Draw into `box` without sending what is drawn: the part's values and widgets are worked out as on any page
    (later parts may use them), but the browser receives none of its elements. Streamlit hands every element to
    the run context's `_enqueue` (its one way out to the session); only element deltas are held back, so the
    container itself, already sent, keeps the page's element positions."""
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    ctx, ss = get_script_run_ctx(), st.session_state
    send = ctx._enqueue
    ctx._enqueue = lambda msg: None if msg.WhichOneof("type") == "delta" else send(msg)
    ss["_unsent"] = True
    try:
        with box:
            yield
    finally:
        ctx._enqueue = send
        ss.pop("_unsent", None)


def unsent() -> bool:
    """Whether what is drawn now goes nowhere (a part above the one the page shows alone): app/plots.py then builds
    and converts no figure, table or CSV, the dearest elements of a part."""
    return bool(st.session_state.get("_unsent"))


def valid(view: str | None, key) -> bool:
    return isinstance(key, str) and key in SECTIONS.get(view or "", ())


def request(view: str, key: str | None) -> None:
    """Land on part `key` of `view` (None: the top of the page) after the next page run; call it where the view is
    chosen (a button's callback, a lecture step, a preset, the link's first read)."""
    ss = st.session_state
    if valid(view, key):
        ss["section"] = key
    else:
        ss.pop("section", None)
    ss["_landing"] = int(ss.get("_landing") or 0) + 1


def current(view: str) -> str | None:
    """The part the page is about, while it is one of this view's (a view switched by hand drops it)."""
    key = st.session_state.get("section")
    if valid(view, key):
        return key
    st.session_state.pop("section", None)
    return None


# Runs in the page's own window (a script element it adds there), so it outlives its frame when a page run
# replaces the frame. __landing remembers the last request handled: a frame drawn again never scrolls again.
LAND_JS = """(function (target, number) {
  const win = window, doc = document;
  if (win.__landing === number) return;
  win.__landing = number;
  if (win.__landingStop) win.__landingStop();
  let stopped = false, since = null, last = null, idleSince = null;
  const begun = performance.now();
  const scrollKeys = new Set(["ArrowDown", "ArrowUp", "PageDown", "PageUp", "Home", "End", " "]);
  const onKey = e => { if (scrollKeys.has(e.key)) stop(); };
  const events = [["wheel", stop], ["touchmove", stop], ["mousedown", stop], ["keydown", onKey]];
  function stop() {
    stopped = true;
    events.forEach(([name, f]) => win.removeEventListener(name, f, true));
  }
  win.__landingStop = stop;
  events.forEach(([name, f]) => win.addEventListener(name, f, true));
  function tick() {
    if (stopped) return;
    const now = performance.now();
    const main = doc.querySelector('[data-testid="stMain"]');
    const app = doc.querySelector('[data-testid="stApp"]');
    // a page whose probe has just reported its screen (app/screen_probe.js) is about to run again, for that screen:
    // what that run changes (the player's height and pinning, the parts above) is still to come. So is the page's
    // own drawing on a slow device: the probe, mounted with the page's components, has not measured yet, or an
    // element loaded on demand (a figure) still stands as a skeleton. A device can take tens of seconds for that
    // after the run has ended; it is waited for up to a minute.
    const screen = doc.documentElement.dataset.screen;
    const drawing = (!screen || !!doc.querySelector('[data-testid="stSkeleton"]')) && now - begun < 60000;
    const running = !app || app.getAttribute("data-test-script-state") === "running" || screen === "reported" ||
      drawing;
    const el = target ? doc.querySelector(".st-key-" + target) : null;
    let offset = null;
    if (main && (!target || (!el && !running))) {  // the top, or a part the finished run did not draw
      main.scrollTop = 0;
      offset = main.scrollTop;
    } else if (main && el) {
      // what lies over the main area's top: Streamlit's header, and under it a lecture's player where it stays
      // pinned (app/page_style.py)
      const header = doc.querySelector('[data-testid="stHeader"]');
      const bar = doc.querySelector(".st-key-lecture_bar");
      const box = main.getBoundingClientRect(), rect = el.getBoundingClientRect();
      const head = header ? Math.max(header.getBoundingClientRect().bottom - box.top, 0) : 0;
      const wrap = bar && bar.parentElement;
      const pinned = wrap && getComputedStyle(wrap).position === "sticky" ? wrap.getBoundingClientRect().height : 0;
      const covered = head + pinned + 8;
      const inMain = r => r.top - box.top + main.scrollTop;  // a box's top in the main area's content
      // the scroll from which the player stands pinned: its place in the page, under the element before it (or
      // at its block's top), where it would be without pinning
      let before = wrap && wrap.previousElementSibling;
      while (before && !before.getClientRects().length) before = before.previousElementSibling;
      const holder = wrap && getComputedStyle(wrap.parentElement);
      const place = !pinned ? 0 : before
        ? inMain(before.getBoundingClientRect()) + before.getBoundingClientRect().height + (parseFloat(holder.rowGap) || 0)
        : inMain(wrap.parentElement.getBoundingClientRect()) + (parseFloat(holder.paddingTop) || 0);
      const pinsFrom = pinned ? place - head : Infinity;
      const top = inMain(rect);
      const highest = Math.max(0, top - covered);  // the part's top just under the player
      let wanted = Math.max(0, top + Math.min(rect.height, main.clientHeight - covered) - main.clientHeight);
      // no element left half under the header or the player's bottom edge (a heading over the part, the slider
      // labels of the title's row, whose bare values would stay): one that would stand across an edge is scrolled
      // past whole, as long as the part's top stays in view
      const above = [...main.querySelectorAll('[data-testid="stElementContainer"]')]
        .filter(e => !el.contains(e) && !(bar && bar.contains(e)))
        .map(e => e.getBoundingClientRect()).filter(r => r.height > 0 && inMain(r) < top)
        .map(r => [inMain(r), inMain(r) + r.height]);
      for (let again = 0; again < 3; again++) {
        let more = wanted;
        const edge = wanted >= pinsFrom - 1 ? covered - 8 : head;  // the player's bottom, or the header's
        for (const [a, b] of above)
          if (a < wanted + edge - 1 && wanted + edge < b - 1) more = Math.max(more, b - edge);
        more = Math.min(more, highest);
        if (more <= wanted) break;
        wanted = more;
      }
      if (Math.abs(main.scrollTop - wanted) > 1) main.scrollTop = wanted;
      offset = Math.round(wanted) + "|" + Math.round(rect.height);
    }
    if (offset !== last) { last = offset; since = now; }
    idleSince = running ? null : (idleSince === null ? now : idleSince);
    const settled = idleSince !== null && now - since > 1500;
    const waitedOut = (idleSince !== null && now - idleSince > 15000) || now - begun > 600000;
    if (settled || waitedOut) return stop();
    win.setTimeout(tick, 100);
  }
  tick();
})"""

FRAME = """<script>
const doc = window.parent.document, s = doc.createElement("script");
s.textContent = %s;
doc.body.appendChild(s);
s.remove();
</script>"""


def landing() -> None:
    """The script of the latest request (none before the first), in the sidebar: it takes no room in the main area,
    and it runs in the page's window whether the sidebar is folded or not."""
    ss = st.session_state
    whole = bool(ss.get("room_whole"))
    if ss.get("room_following") and whole != ss.get("_whole", whole):
        # Show whole views / Only each step's part fills or empties the parts above the step's: the page lands on
        # that part again, or it would be pushed off the screen by the figures drawn above it
        request(ss.get("view"), ss.get("section"))
    ss["_whole"] = whole
    number = int(ss.get("_landing") or 0)
    if not number:
        return
    view = ss.get("view")
    key = ss.get("section")
    target = css_key(view, key) if valid(view, key) else None  # checked against SECTIONS: only known names
    if target is None and ss.get("cmp"):  # compare mode: its figures (the top of the page if none are drawn)
        target = COMPARISON
    elif target is None and ss.get("lecture") and SECTIONS.get(view):
        # a lecture step about no part: its view's main figure, under the player (at the top of the page, the
        # title's row, the player and the view's choices fill a projector's first screen above it)
        target = css_key(view, SECTIONS[view][0])
    call = f"{LAND_JS}({json.dumps(target)}, {number});"
    with st.sidebar:
        st.iframe(FRAME % json.dumps(call), height=1)


def markdown() -> str:
    """The sections' table of docs/lectures.md (a test checks the page holds it)."""
    rows = ["| view | sections, in page order |", "|---|---|"]
    rows += [f"| {view} | {', '.join(f'`{k}`' for k in keys)} |" for view, keys in SECTIONS.items()]
    return "\n".join(rows)
