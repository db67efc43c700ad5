// The chat page: post a turn, then read the agent's answer as Server-Sent Events from the same response.
// Everything the agent or the model wrote is put in the page with textContent: it is text, never HTML.
(function () {
  "use strict";
  var form = document.getElementById("chat-form");
  if (!form) {
    return;
  }
  var conversation = document.getElementById("conversation");
  var csrf = form.querySelector("input[name=csrf]").value;
  var session = form.querySelector("input[name=session]").value;
  var box = form.querySelector("textarea[name=message]");
  var button = form.querySelector("button[type=submit]");
  var picker = form.querySelector("input[name=files]");
  var RASTER = ["image/png", "image/jpeg", "image/gif", "image/webp"];

  function element(tag, className, text) {
    var node = document.createElement(tag);
    if (className) {
      node.className = className;
    }
    if (text !== undefined) {
      node.textContent = text;
    }
    return node;
  }

  function message(role) {
    var empty = document.getElementById("no-messages");
    if (empty) {
      empty.remove();
    }
    var item = element("li", "message from-" + role);
    conversation.appendChild(item);
    return item;
  }

  function Turn(item) {
    this.item = item;
    this.text = element("div", "text");
    item.appendChild(this.text);
    this.cards = {};
  }

  Turn.prototype.card = function (callId, name) {
    var card = this.cards[callId];
    if (!card) {
      card = element("div", "tool-card running");
      card.setAttribute("data-call-id", callId);
      card.appendChild(element("span", "tool-name", name));
      card.appendChild(element("span", "tool-status", "running…"));
      this.item.insertBefore(card, this.text);
      this.cards[callId] = card;
    }
    return card;
  };

  Turn.prototype.status = function (card, state, text) {
    card.className = "tool-card " + state;
    card.querySelector(".tool-status").textContent = text;
  };

  Turn.prototype.on = function (kind, data) {
    var card;
    if (kind === "text") {
      this.text.textContent += data.text;
    } else if (kind === "tool_started") {
      card = this.card(data.call_id, data.name);
      card.appendChild(element("pre", "tool-arguments", data.arguments));
    } else if (kind === "tool_finished") {
      card = this.card(data.call_id, data.name);
      if (data.error) {
        this.status(card, "failed", data.error.code + ": " + data.error.message);
      } else {
        this.status(card, "done", "ok (" + data.duration_seconds.toFixed(2) + " s)");
      }
    } else if (kind === "approval_requested") {
      card = this.card(data.call_id, data.name);
      this.status(card, "waiting", "waiting for a person's approval (see Approvals)");
    } else if (kind === "approval_decided") {
      card = this.card(data.call_id, data.name);
      this.status(card, data.runs ? "running" : "failed",
        data.outcome + (data.decided_by ? " by " + data.decided_by : "") + (data.reason ? ": " + data.reason : ""));
    } else if (kind === "answer") {
      if (!this.text.textContent) {
        this.text.textContent = data.answer;
      }
      if (data.run_id) {
        var link = element("a", "run-link", "run");
        link.href = "/runs/" + encodeURIComponent(data.run_id);
        this.item.appendChild(link);
      }
      if (data.files && data.files.length) {  // what the turn's scripts gave back
        this.item.appendChild(fileList(data.files));
      }
    } else if (kind === "error") {
      this.item.appendChild(element("div", "error", data.message));
    }
  };

  // A file as the run page shows it: a raster image (its sniffed type) inline, anything else as a download.
  function fileItem(file) {
    var item = element("li", "file");
    var link = element("a", null, file.name);
    link.href = "/api/files/" + encodeURIComponent(file.id);
    link.setAttribute("download", file.name.split("/").pop());
    var about = " (" + file.media_type + ", " + file.size.toLocaleString("en") + " bytes)";
    if (RASTER.indexOf(file.media_type) >= 0) {
      var figure = element("figure");
      var image = element("img");
      image.src = link.href;
      image.alt = file.name;
      var caption = element("figcaption");
      caption.appendChild(link);
      caption.appendChild(document.createTextNode(about));
      figure.appendChild(image);
      figure.appendChild(caption);
      item.appendChild(figure);
    } else {
      item.appendChild(link);
      item.appendChild(document.createTextNode(about));
    }
    return item;
  }

  function fileList(files) {
    var list = element("ul", "files");
    files.forEach(function (file) {
      list.appendChild(fileItem(file));
    });
    return list;
  }

  async function upload(file) {
    var response = await fetch(form.action + "/files?session=" + encodeURIComponent(session), {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRF-Token": csrf, "X-File-Name": encodeURIComponent(file.name) },
      body: file
    });
    if (!response.ok) {
      throw new Error(file.name + ": " + response.status + ": " + (await response.text()));
    }
    return response.json();
  }

  function parse(block) {
    var kind = "message";
    var data = "";
    block.split("\n").forEach(function (line) {
      if (line.indexOf("event: ") === 0) {
        kind = line.slice(7);
      } else if (line.indexOf("data: ") === 0) {
        data += line.slice(6);
      }
    });
    return { kind: kind, data: data ? JSON.parse(data) : {} };
  }

  async function send(text, chosen) {
    var mine = message("user");
    mine.appendChild(element("div", "text", text));
    var attached = [];
    for (var i = 0; i < chosen.length; i++) {
      attached.push(await upload(chosen[i]));
    }
    if (attached.length) {
      mine.appendChild(fileList(attached));
    }
    var turn = new Turn(message("assistant"));
    var response = await fetch(form.action, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf, "Accept": "text/event-stream" },
      body: JSON.stringify({ session: session, message: text, files: attached.map(function (f) { return f.id; }) })
    });
    if (!response.ok) {
      turn.on("error", { message: response.status + ": " + (await response.text()) });
      return;
    }
    var reader = response.body.getReader();
    var decoder = new TextDecoder();
    var buffered = "";
    for (;;) {
      var chunk = await reader.read();
      if (chunk.done) {
        break;
      }
      buffered += decoder.decode(chunk.value, { stream: true });
      var end;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        var event = parse(buffered.slice(0, end));
        buffered = buffered.slice(end + 2);
        turn.on(event.kind, event.data);
      }
    }
  }

  form.addEventListener("submit", function (submitted) {
    submitted.preventDefault();
    var text = box.value.trim();
    if (!text || button.disabled) {
      return;
    }
    var chosen = picker ? Array.prototype.slice.call(picker.files) : [];
    box.value = "";
    if (picker) {
      picker.value = "";
    }
    button.disabled = true;
    form.setAttribute("data-busy", "true");
    send(text, chosen).catch(function (failure) {
      message("assistant").appendChild(element("div", "error", String(failure)));
    }).finally(function () {
      button.disabled = false;
      form.removeAttribute("data-busy");
      box.focus();
    });
  });
  form.setAttribute("data-ready", "true");  // the page's own script took over the form
})();
