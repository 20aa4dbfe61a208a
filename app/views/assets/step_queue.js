// Step, Back and Fwd clicks (and their keys) are never lost: the page's click queue. The
// presenter keys work from anywhere on the page except text inputs and sliders (which the
// arrows adjust): → Step, ← Back, space Play/Pause; a tab bar, a radio or a button with the
// keyboard focus does not take them.
//
// A Streamlit button reaches the server as a yes/no trigger, and Streamlit merges the triggers of
// clicks that arrive while a rerun of the same fragment is still running or waiting to run
// (streamlit/runtime/scriptrunner_utils/script_requests.py, `_coalesce_widget_states`), so
// quick clicks became fewer steps: measured in Chromium before this queue, 10 clicks 100 ms apart
// gave 8 steps and 6 clicks 20 ms apart gave 4.
//
// So the page itself holds a Step (click or →) made while the previous one is still being served
// and sends it when the app is idle again, one at a time: every click is one rerun, one step.
// "Being served" is read off Streamlit's own run state (`data-test-script-state` on the app
// element: `running` / `notRunning`). A quick run can start and end within one update of the
// page, so that attribute never changes: such a Step is over once the page draws its step (the
// view's last line, "rendered step N", differs from when it was sent), unless another run was
// under way or Play was on when it was sent (their steps redraw that line too). Before that
// check, now and then (about one click in 20 in one-session runs) a click was held for the 3 s
// fallback that is left for a click that caused no run at all.
if (!window.__pagedLabStepQueue) {
  window.__pagedLabStepQueue = {};       // its state, readable from the console and tests
  const app = () => document.querySelector('[data-testid="stApp"]');
  const busyState = (s) => s === "running" || s === "rerunRequested";
  // the page may hold two copies of the button for a moment (a fragment rerun draws the new
  // one before the old one goes): a click on either counts, a replay clicks the newest shown
  // Reset (its button, or "r": keys.js clicks it) goes through the queue too, and wins over
  // it: the Steps held when it is clicked are dropped, and it waits only for the run in flight
  // (issue 45: 30 quick → then r ended at step 25, not 0)
  const QUEUED = {step: ".st-key-step_btn button", back: ".st-key-back_btn button",
                  forward: ".st-key-forward_btn button", reset: ".st-key-reset_btn button"};
  const KEYS = {ArrowRight: "step", ArrowLeft: "back"};
  // where typing needs the keys: text fields, number fields, select boxes and their open
  // lists, sliders
  const TEXT = "textarea, select, [contenteditable], input:not([type=checkbox]):not([type=radio])" +
    ":not([type=button]), [role=listbox], [role=option], [role=menu], [role=slider]";
  const nameOf = (t) => {
    if (!(t && t.closest)) return null;
    for (const [name, sel] of Object.entries(QUEUED)) if (t.closest(sel)) return name;
    return null;
  };
  const buttonOf = (name) => {
    const shown = [...document.querySelectorAll(QUEUED[name])]
      .filter((b) => b.offsetParent !== null);
    return shown.length ? shown[shown.length - 1] : null;
  };
  const MARKER = '[data-testid="stCaptionContainer"]';
  const shownStep = () => {            // the view's last line: "rendered step N"
    const m = [...document.querySelectorAll(MARKER)].map((e) => e.textContent)
      .filter((t) => t.startsWith("rendered step "));
    return m.length ? m[m.length - 1] : null;
  };
  let inflight = false, sawRun = false, since = 0, replaying = false, sentAt;
  const queue = [];                      // the names of the clicks held, oldest first
  Object.defineProperties(window.__pagedLabStepQueue, {
    inflight: {get: () => inflight}, queued: {get: () => queue.length}});
  const playing = () => {
    const b = document.querySelector(".st-key-play_btn button");
    return !!(b && b.textContent.includes("Pause"));
  };
  const sent = () => {
    inflight = true; sawRun = false; since = performance.now();
    const a = app();      // the drawn line tells this Step's end only if no other run draws it
    sentAt = (a && busyState(a.dataset.testScriptState)) || playing() ? undefined : shownStep();
  };
  const release = () => {
    inflight = false;
    while (queue.length) {
      const b = buttonOf(queue.shift());
      if (!b || b.disabled) continue;    // at an end (finished, step 0): that click is moot
      replaying = true;
      b.click();
      return;
    }
  };
  const watch = () => {
    const a = app();
    if (!a) { setTimeout(watch, 200); return; }
    // one callback may carry both changes (running, then notRunning): read each old value
    new MutationObserver((records) => {
      if (records.some((m) => busyState(m.oldValue))) sawRun = true;
      if (busyState(a.dataset.testScriptState)) sawRun = true;
      else if (inflight && sawRun) release();
    }).observe(a, {attributes: true, attributeOldValue: true,
                   attributeFilter: ["data-test-script-state"]});
  };
  watch();
  setInterval(() => {           // a run the state never showed; a click that started no run
    const a = app();
    if (!inflight || sawRun || !a || busyState(a.dataset.testScriptState)) return;
    if ((sentAt !== undefined && shownStep() !== sentAt) || performance.now() - since > 3000) {
      release();
    }
  }, 100);
  document.addEventListener("click", (e) => {
    const name = nameOf(e.target);
    if (!name) return;
    if (name === "reset") queue.length = 0;
    if (replaying) { replaying = false; sent(); return; }
    if (inflight) { e.preventDefault(); e.stopImmediatePropagation(); queue.push(name); return; }
    sent();
  }, true);
  // the keys, before Streamlit's own shortcuts and before a focused tab bar or slider (which
  // would switch tabs or move instead): the page's, except in a text field
  window.addEventListener("keydown", (e) => {
    const t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey || e.shiftKey || e.repeat && e.key === " ") return;
    if (!(e.key in KEYS) && e.key !== " ") return;
    if (t && t.closest && t.closest(TEXT)) return;
    e.preventDefault(); e.stopImmediatePropagation();
    if (e.key === " ") {
      const play = document.querySelector(".st-key-play_btn button");
      if (play && !play.disabled) play.click();
      return;
    }
    const name = KEYS[e.key];
    const b = buttonOf(name);
    if (!b || (b.disabled && !inflight)) return;
    if (inflight) { queue.push(name); return; }
    b.click();                           // its click is counted by the listener above
  }, true);
}
