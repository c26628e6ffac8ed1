// The page's side of app/screen.py, run by the browser once per page.
//
// 1. It reports the width of the main column (px, rounded down to data.step), the window's width and whether the
//    pointer is a finger, whenever they differ from what the server assumed (data) by more than data.slack px: a
//    scroll bar coming and going never redraws the page. It keeps the measurement in a cookie (data.cookie), from
//    which the server starts when this browser opens the next page.
// 2. On a touch screen a finger on a Plotly figure scrolls the page, and one tap selects a cell as a mouse click
//    does. Plotly holds every touch that starts on a plot (its pan and zoom), and selects the point under its last
//    hover, which a finger makes only after the tap; the emulated mouse events that follow a tap would count as a
//    second click and undo the selection. So the page keeps such touches from Plotly, lets the browser scroll, and
//    turns a touch that did not move into what a mouse does: hover, press and release at that point.
// 3. It loads the fonts of the page's prose, code and formulas (PAGE_FONTS: Streamlit's Source Sans and Source
//    Code, KaTeX's) as soon as the page declares them. Plotly draws a figure again when a font of the page that was
//    not loaded as its drawing began has loaded by its end, whether or not the figure uses it; a view's formulas
//    load KaTeX's fonts the first time they appear, while that view's figures draw, and each was drawn again.

function installTap() {
  if (window.__llamaExplorerTap) return;
  window.__llamaExplorerTap = true;
  let start = null;
  const mouse = (type, target, p) => target.dispatchEvent(new MouseEvent(type, {
    clientX: p.clientX, clientY: p.clientY, button: 0, buttons: type === 'mousedown' ? 1 : 0, bubbles: true,
    cancelable: true, view: window}));
  document.addEventListener('touchstart', (e) => {
    start = null;
    const drag = e.target instanceof Element ? e.target.closest('.js-plotly-plot .drag') : null;
    if (!drag) return;
    e.stopPropagation();
    if (e.touches.length === 1 && drag.classList.contains('nsewdrag')) {
      start = {drag, x: e.touches[0].clientX, y: e.touches[0].clientY};
    }
  }, {capture: true, passive: true});
  document.addEventListener('touchend', (e) => {
    if (!start) return;
    const {drag, x, y} = start;
    start = null;
    const p = e.changedTouches[0];
    if (Math.hypot(p.clientX - x, p.clientY - y) > 10) return;  // the page scrolled
    e.preventDefault();
    e.stopPropagation();
    mouse('mousemove', drag, p);
    mouse('mousedown', drag, p);
    mouse('mouseup', drag, p);
  }, {capture: true, passive: false});
}

// The faces the views use ("family|weight|style"): those a walk through every view, every explanation open, loads
// in either language (tests/test_browser_downloads.py checks that its walk, in Chinese, loads no other)
const PAGE_FONTS = new Set([
  'Source Sans|100 900|normal', 'Source Sans|100 900|italic', 'Source Code Pro|100 900|normal',
  'Material Symbols Rounded|400|normal', 'KaTeX_Main|400|normal', 'KaTeX_Math|400|italic', 'KaTeX_AMS|400|normal',
  'KaTeX_Caligraphic|400|normal', 'KaTeX_Size1|400|normal', 'KaTeX_Size2|400|normal', 'KaTeX_Size3|400|normal',
  'KaTeX_Size4|400|normal']);

function loadFonts() {
  if (window.__llamaExplorerFonts) return;
  window.__llamaExplorerFonts = true;
  const load = () => document.fonts.forEach((face) => {
    if (face.status === 'unloaded' && PAGE_FONTS.has(`${face.family}|${face.weight}|${face.style}`)) {
      face.load().catch(() => {});
    }
  });
  load();
  // KaTeX's stylesheet arrives with the first formula: its fonts are declared then
  new MutationObserver(load).observe(document.head, {childList: true});
}

// Streamlit calls the function below again with each run's data while the probe stays mounted; the cleanup it
// returns runs only when the probe is unmounted. So the page keeps one measuring state (window.__llamaExplorerProbe)
// that each call hands its data and its setStateValue: a measurement is judged against the server's latest
// assumption, never against an earlier run's (an earlier call's observer, still watching, marked a page drawn for
// its screen as "reported" again, and every resize was measured once per call).
export default function ({data, setStateValue}) {
  installTap();
  loadFonts();
  const probe = window.__llamaExplorerProbe ??= {sent: null, timer: null, watched: null};
  const owner = {};
  Object.assign(probe, {data, setStateValue, owner});
  if (!probe.measure) {
    probe.measure = () => {
      const main = document.querySelector('[data-testid="stMainBlockContainer"]');
      if (!main) return;
      const {data, sent} = probe;
      const style = getComputedStyle(main);
      const inner = main.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      const now = {main: Math.floor(inner / data.step) * data.step, window: window.innerWidth,
                   touch: window.matchMedia('(pointer: coarse)').matches};
      const kept = `${now.main}.${now.window}.${now.touch ? 1 : 0}`;
      if (!document.cookie.split('; ').includes(`${data.cookie}=${kept}`)) {
        document.cookie = `${data.cookie}=${kept}; path=/; max-age=31536000; SameSite=Lax`;
      }
      const same = (a) => a && Math.abs(a.main - now.main) <= data.slack && a.touch === now.touch &&
          (a.window < data.stack) === (now.window < data.stack);
      // the page says whether the server has drawn it for this screen (a test waits for "drawn")
      document.documentElement.dataset.screen = same(data) ? 'drawn' : 'reported';
      if (same(data) || same(sent)) return;
      probe.sent = now;
      probe.setStateValue('screen', now);
    };
    probe.later = () => { clearTimeout(probe.timer); probe.timer = setTimeout(probe.measure, 150); };
    probe.observer = new ResizeObserver(probe.later);
    window.addEventListener('resize', probe.later);
  }
  const main = document.querySelector('[data-testid="stMainBlockContainer"]');
  if (main && main !== probe.watched) {  // (Streamlit may have drawn the main column anew)
    probe.observer.disconnect();
    probe.observer.observe(main);
    probe.watched = main;
  }
  probe.measure();
  return () => {  // unmounted: the page measures no more, unless a later call has taken the probe over
    if (probe.owner !== owner) return;
    probe.observer.disconnect();
    window.removeEventListener('resize', probe.later);
    clearTimeout(probe.timer);
    delete window.__llamaExplorerProbe;
  };
}
