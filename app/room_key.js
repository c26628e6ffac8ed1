// The projector tab's copy of the presenter's key (app/room_key.py), in sessionStorage: this origin, this tab.
// data.keep: the key, sent to the presenter's page, stored; data.checked: the kept key the server has already
// compared. A page that has a kept key the server has not compared (a reload, a new session of a restarted server)
// gives it back.
const NAME = 'llama_explorer_presenter_key';

export default function ({data, setStateValue}) {
  let kept = null;
  try {
    if (data.keep) sessionStorage.setItem(NAME, data.keep);
    kept = sessionStorage.getItem(NAME);
  } catch (e) {  // storage switched off: the presenter's link is the only way to present
    return;
  }
  if (kept && !data.keep && kept !== data.checked) setStateValue('kept', kept);
}
