// Step clicks are never lost: the page's click queue.
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
  const STEP = ".st-key-step_btn button";
  const WIDGETS = "input, textarea, select, [contenteditable], [role=slider], [role=spinbutton], " +
    "[role=combobox], [role=listbox], [role=option], [role=tab], [role=radio], [role=menu]";
  const isStep = (t) => !!(t && t.closest && t.closest(STEP));
  const stepButton = () => {
    const shown = [...document.querySelectorAll(STEP)].filter((b) => b.offsetParent !== null);
    return shown.length ? shown[shown.length - 1] : null;
  };
  const MARKER = '[data-testid="stCaptionContainer"]';
  const shownStep = () => {            // the view's last line: "rendered step N"
    const m = [...document.querySelectorAll(MARKER)].map((e) => e.textContent)
      .filter((t) => t.startsWith("rendered step "));
    return m.length ? m[m.length - 1] : null;
  };
  let inflight = false, sawRun = false, since = 0, queued = 0, replaying = false, sentAt;
  Object.defineProperties(window.__pagedLabStepQueue, {
    inflight: {get: () => inflight}, queued: {get: () => queued}});
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
    if (queued === 0) return;
    const b = stepButton();
    if (!b || b.disabled) { queued = 0; return; }   // finished (or left the page): drop them
    queued -= 1;
    replaying = true;
    b.click();
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
    if (!isStep(e.target)) return;
    if (replaying) { replaying = false; sent(); return; }
    if (inflight) { e.preventDefault(); e.stopImmediatePropagation(); queued += 1; return; }
    sent();
  }, true);
  window.addEventListener("keydown", (e) => {     // → is the Step button's shortcut
    const t = e.target;
    if (e.key !== "ArrowRight" || e.ctrlKey || e.metaKey || e.altKey || e.shiftKey) return;
    // → on a widget that uses the arrow keys itself (a text field, the speed slider, a
    // select, the tabs) is that widget's, never a Step
    if (t && t.closest && t.closest(WIDGETS)) return;
    const b = stepButton();
    if (!b || b.disabled) return;
    if (inflight) { e.preventDefault(); e.stopImmediatePropagation(); queued += 1; return; }
    sent();
  }, true);
}
