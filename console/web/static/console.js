// Pages that show live state (the calls waiting for approval) reload themselves every few seconds,
// unless the person is typing a reason or has focus in a form.
(function () {
  "use strict";
  var seconds = Number(document.body.getAttribute("data-refresh") || 0);
  if (!seconds) {
    return;
  }
  window.setInterval(function () {
    var busy = Array.prototype.some.call(document.querySelectorAll("input[type=text]"), function (input) {
      return input === document.activeElement || input.value !== "";
    });
    if (!busy) {
      window.location.reload();
    }
  }, seconds * 1000);
})();
