// The clicker's keys for the lecture player (app/lecture_player.py): → PageDown space forward, ← PageUp Shift+space
// back, not while the cursor is in a text box. A press sends the step it leads to, counted from the step the page
// last asked for while the server has not yet drawn it: presses during a long step's run add up (each press is one
// step), where a click on the player's button during a run counts once however often it is pressed (Streamlit
// merges a button's clicks that reach a running script into one).
//
// data: step (on screen), n (steps), seq (the last press the server applied), session (its id: a server restarted
// under the page starts from seq 0 again).

function install() {
  if (window.__lectureKeysInstalled) return;
  window.__lectureKeysInstalled = true;
  document.addEventListener('keydown', (e) => {
    const now = window.__lectureKeysNow;
    if (!now) return;  // no player on the page
    const el = e.target, tag = ((el && el.tagName) || '').toLowerCase();
    if (tag === 'input' || tag === 'textarea' || tag === 'select' || (el && el.isContentEditable)) return;
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    let delta = 0;
    if (e.key === 'ArrowRight' || e.key === 'PageDown' || (e.key === ' ' && !e.shiftKey)) delta = 1;
    else if (e.key === 'ArrowLeft' || e.key === 'PageUp' || (e.key === ' ' && e.shiftKey)) delta = -1;
    if (!delta) return;
    e.preventDefault();
    e.stopPropagation();
    const {data, setStateValue} = now;
    const sent = window.__lectureKeysSent;
    const waiting = sent && sent.session === data.session && sent.seq > data.seq;
    const from = waiting ? sent.step : data.step;
    const step = Math.min(Math.max(from + delta, 0), data.n - 1);
    if (step === from) return;  // the first or the last step
    const seq = Math.max(waiting ? sent.seq : 0, data.seq) + 1;
    window.__lectureKeysSent = {session: data.session, seq, step};
    setStateValue('press', {seq, step});
  }, true);
}

export default function (component) {
  install();
  window.__lectureKeysNow = component;
  return () => { if (window.__lectureKeysNow === component) window.__lectureKeysNow = null; };
}
