// The chat page of `ember-llm --serve`: sends the conversation to /v1/chat/completions, streams the reply in as
// server-sent events and renders it as markdown. The stop button aborts the fetch, which closes the connection; the
// server notices between two tokens and stops generating. No third-party code: the markdown renderer is below and
// escapes all HTML before adding its own tags.
"use strict";

// ** markdown: the text is escaped first, then only the tags below are added **

function escapeHtml(text) {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;")
    .replace(/'/g, "&#39;");
}

// inline markup of one escaped line: code spans are set aside first so that nothing inside them is formatted
function renderInline(escaped) {
  const spans = [];
  let html = escaped.replace(/`([^`]+)`/g, (_, code) => {
    spans.push(`<code>${code}</code>`);
    return `\u0000${spans.length - 1}\u0000`;
  });
  html = html
    .replace(/\*\*(?=\S)(.+?)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^\w*])\*(?=\S)([^*]+?)\*(?!\w)/g, "$1<em>$2</em>")
    .replace(/(^|[^\w])_(?=\S)([^_]+?)_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~(?=\S)(.+?)~~/g, "<del>$1</del>")
    // links only to http(s) addresses; the URL was escaped with the rest, so it cannot leave the attribute
    .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" rel="noopener noreferrer" target="_blank">$1</a>');
  return html.replace(/\u0000(\d+)\u0000/g, (_, i) => spans[Number(i)]);
}

function renderMarkdown(source) {
  const lines = source.replace(/\u0000/g, "").split("\n");
  const out = [];
  let paragraph = [];
  let list = null; // {tag: "ul" | "ol", items: [...]}
  const flushParagraph = () => {
    if (paragraph.length) out.push(`<p>${paragraph.map(renderInline).join("<br>")}</p>`);
    paragraph = [];
  };
  const flushList = () => {
    if (list) out.push(`<${list.tag}>${list.items.map((item) => `<li>${renderInline(item)}</li>`).join("")}</${list.tag}>`);
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/);
    if (fence) { // a code block runs to its closing fence, or to the end while the reply is still streaming
      flushParagraph();
      flushList();
      const code = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(fence[1]); i++) code.push(lines[i]);
      const language = fence[2] ? ` class="language-${escapeHtml(fence[2])}"` : "";
      out.push(`<pre><code${language}>${escapeHtml(code.join("\n"))}</code></pre>`);
      continue;
    }
    const escaped = escapeHtml(line);
    const heading = escaped.match(/^(#{1,6})\s+(.*)$/);
    const bullet = escaped.match(/^\s*[-*+]\s+(.*)$/);
    const numbered = escaped.match(/^\s*\d+[.)]\s+(.*)$/);
    const quote = escaped.match(/^&gt;\s?(.*)$/);
    if (!line.trim()) {
      flushParagraph();
      flushList();
    } else if (heading) {
      flushParagraph();
      flushList();
      const level = Math.min(heading[1].length + 2, 6); // the page's own title is the only h1
      out.push(`<h${level}>${renderInline(heading[2])}</h${level}>`);
    } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flushParagraph();
      flushList();
      out.push("<hr>");
    } else if (bullet || numbered) {
      flushParagraph();
      const tag = bullet ? "ul" : "ol";
      if (list && list.tag !== tag) flushList();
      if (!list) list = {tag, items: []};
      list.items.push((bullet || numbered)[1]);
    } else if (quote) {
      flushParagraph();
      flushList();
      out.push(`<blockquote>${renderInline(quote[1])}</blockquote>`);
    } else {
      flushList();
      paragraph.push(escaped);
    }
  }
  flushParagraph();
  flushList();
  return out.join("\n");
}

// ** the conversation **

const $ = (id) => document.getElementById(id);
const state = {messages: [], controller: null, model: null, chat: 0}; // chat: counts "New chat" clicks

function addBubble(role, text) {
  $("empty").hidden = true;
  const bubble = document.createElement("div");
  bubble.className = `message ${role}`;
  if (role === "user") bubble.textContent = text;
  else bubble.innerHTML = renderMarkdown(text);
  $("conversation").appendChild(bubble);
  bubble.scrollIntoView({block: "end"});
  return bubble;
}

function addNote(bubble, text, isError) {
  const note = document.createElement("div");
  note.className = isError ? "note error" : "note";
  note.textContent = text;
  bubble.appendChild(note);
}

function setGenerating(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  $("prompt").disabled = on;
}

function numberSetting(id) {
  const input = $(id);
  return input.value === "" || !input.checkValidity() ? null : Number(input.value);
}

function requestBody() {
  const body = {messages: state.messages, stream: true, stream_options: {include_usage: true}};
  if (state.model) body.model = state.model;
  for (const [id, key] of [["temperature", "temperature"], ["top-p", "top_p"], ["max-tokens", "max_tokens"],
                           ["seed", "seed"]]) {
    const value = numberSetting(id);
    if (value !== null) body[key] = value;
  }
  return body;
}

function showSpeed(tokens, seconds) {
  $("speed").textContent = seconds > 0 ? `${tokens} tokens · ${(tokens / seconds).toFixed(1)} tokens/s` : "";
}

// reads the server-sent events of `response`, calling onEvent with each parsed `data:` payload
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffered += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (data === "[DONE]") return;
      if (data) onEvent(JSON.parse(data));
    }
  }
}

async function send(text) {
  const chat = state.chat;
  state.messages.push({role: "user", content: text});
  addBubble("user", text);
  const bubble = addBubble("assistant", "");
  bubble.classList.add("streaming");
  const controller = new AbortController();
  state.controller = controller;
  setGenerating(true);
  let reply = "", tokens = 0, first = null, redraw = false, note = null;
  const draw = () => {
    redraw = false;
    bubble.innerHTML = renderMarkdown(reply);
    bubble.scrollIntoView({block: "end"});
  };
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(requestBody()),
      signal: controller.signal,
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(body.error ? body.error.message : `HTTP ${response.status}`);
    }
    await readEvents(response, (event) => {
      if (event.error) throw new Error(event.error.message);
      if (event.usage) tokens = event.usage.completion_tokens;
      const delta = event.choices && event.choices[0] && event.choices[0].delta;
      if (delta && delta.content) {
        first = first || performance.now();
        reply += delta.content;
        tokens += 1; // one event per decoded piece: about one per token; the usage event gives the exact count
        showSpeed(tokens, (performance.now() - first) / 1000);
        if (!redraw) {
          redraw = true;
          requestAnimationFrame(draw);
        }
      }
    });
    if (first !== null) showSpeed(tokens, (performance.now() - first) / 1000);
  } catch (error) {
    note = error.name === "AbortError" ? ["stopped", false] : [`error: ${error.message}`, true];
  } finally {
    draw();
    if (note) addNote(bubble, ...note); // after the last draw, which replaces the bubble's content
    bubble.classList.remove("streaming");
    const current = chat === state.chat; // false once "New chat" was clicked while this reply streamed
    if (current && (controller.signal.aborted || reply)) state.messages.push({role: "assistant", content: reply});
    else if (current) state.messages.pop(); // the request failed: the user can edit the message and send it again
    if (state.controller === controller) {
      state.controller = null;
      setGenerating(false);
      $("prompt").focus();
    }
  }
}

function stop() {
  if (state.controller) state.controller.abort();
}

function newChat() {
  stop();
  state.chat += 1;
  state.messages = [];
  for (const bubble of document.querySelectorAll(".message")) bubble.remove();
  $("empty").hidden = false;
  $("speed").textContent = "";
  $("prompt").value = "";
  $("prompt").focus();
}

async function loadModel() {
  try {
    const response = await fetch("/v1/models");
    const body = await response.json();
    state.model = body.data[0].id;
    $("model").textContent = state.model;
  } catch (error) {
    $("model").textContent = `no model (${error.message})`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || state.controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  loadModel();
  $("prompt").focus();
});
