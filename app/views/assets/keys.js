// "r" resets (Streamlit reserves R for its own rerun, so button shortcuts cannot take it);
// → / ← / space: step_queue.js (they are queued like clicks, and work wherever the focus is
// but in a text field or slider)
if (!window.__pagedLabKeys) {
  window.__pagedLabKeys = true;
  document.addEventListener("keydown", (e) => {
    const t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey || (e.key !== "r" && e.key !== "R")) return;
    if (t && (t.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(t.tagName))) return;
    const reset = [...document.querySelectorAll("button")].find(
      (b) => b.innerText.trim().startsWith("⟲ Reset"));
    if (reset && !reset.disabled) {
      e.preventDefault(); e.stopImmediatePropagation(); reset.click();
    }
  }, true);
}
