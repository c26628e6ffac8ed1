// The page's side of app/screen.py, run by the browser once per page.
//
// 1. It reports the width of the main column (px, rounded down to data.step), the window's width and whether the
//    pointer is a finger, whenever they differ from what the server assumed (data) by more than data.slack px: a
//    scroll bar coming and going never redraws the page.
// 2. On a touch screen one tap selects a Plotly cell, as a mouse click does. Plotly selects the point under its last
//    hover, and a finger hovers only after the tap, so the tap is made to hover first; the mouse events a browser
//    emulates after a tap would count as a second click and undo the selection, so a tap on a plot cancels them.
//    A touch that moves (the page scrolling) selects nothing.

function installTap() {
  if (window.__llamaExplorerTap) return;
  window.__llamaExplorerTap = true;
  let start = null;
  const mouse = (type, target, p) => target.dispatchEvent(new MouseEvent(type, {
    clientX: p.clientX, clientY: p.clientY, bubbles: true, cancelable: true, view: window}));
  document.addEventListener('touchstart', (e) => {
    start = null;
    const drag = e.target instanceof Element ? e.target.closest('.nsewdrag') : null;
    if (!drag || e.touches.length !== 1) return;
    const p = e.touches[0];
    start = {drag, x: p.clientX, y: p.clientY};
    mouse('mousemove', drag, p);
  }, {capture: true, passive: true});
  document.addEventListener('touchend', (e) => {
    if (!start) return;
    const p = e.changedTouches[0];
    const gd = start.drag.closest('.js-plotly-plot');
    if (Math.hypot(p.clientX - start.x, p.clientY - start.y) > 10) {
      if (gd) gd._hoverdata = undefined;
      mouse('mouseout', start.drag, p);
    } else {
      e.preventDefault();
    }
    start = null;
  }, {capture: true, passive: false});
}

export default function ({data, setStateValue}) {
  installTap();
  let sent = null;
  const measure = () => {
    const main = document.querySelector('[data-testid="stMainBlockContainer"]');
    if (!main) return;
    const style = getComputedStyle(main);
    const inner = main.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const now = {main: Math.floor(inner / data.step) * data.step, window: window.innerWidth,
                 touch: window.matchMedia('(pointer: coarse)').matches};
    const same = (a) => a && Math.abs(a.main - now.main) <= data.slack && a.touch === now.touch &&
        (a.window < data.stack) === (now.window < data.stack);
    if (same(data) || same(sent)) return;
    sent = now;
    setStateValue('screen', now);
  };
  let timer = null;
  const later = () => { clearTimeout(timer); timer = setTimeout(measure, 150); };
  const observer = new ResizeObserver(later);
  const main = document.querySelector('[data-testid="stMainBlockContainer"]');
  if (main) observer.observe(main);
  window.addEventListener('resize', later);
  measure();
  return () => { observer.disconnect(); window.removeEventListener('resize', later); clearTimeout(timer); };
}
