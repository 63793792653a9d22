"use strict";
// The rag-serve page: fills its selectors from GET v1/info, asks POST v1/answer, and draws the answer, its
// passages and (RAG-Token) the per-token passage posterior. Every text from the server is set with textContent
// or as an attribute value, never parsed as HTML. Relative URLs only: the page works offline and behind a prefix.

const $ = (id) => document.getElementById(id);
const SHORT_TEXT = 240;  // characters of a passage shown before its "more" button
const HEAT_RGB = "31, 87, 160";  // the heat map's colour; a cell's alpha is its posterior
const VARIANTS = {token: "RAG-Token", seq: "RAG-Sequence", sequence: "RAG-Sequence", fid: "FiD"};
let knowledge = null;  // /v1/info's knowledge block, for the version line
let requests = 0;  // answered requests (answer or error), published on <body data-requests> for tests

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function passageColour(i) {
  // distinct hues for neighbouring ranks: steps of the golden angle around the colour wheel
  return `hsl(${Math.round((i * 137.508 + 200) % 360)}, 65%, 42%)`;
}

function swatch(i) {
  const box = el("span", {class: "swatch", "aria-hidden": "true"});
  box.style.backgroundColor = passageColour(i);
  return box;
}

function fmt(value, digits) {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "—";
}

function fmtProb(value) {
  // a probability: 4 decimals, or e-notation below 1e-3 (a posterior of 5e-9 is not 0)
  return typeof value === "number" && value > 0 && value < 1e-3 ? value.toExponential(1) : fmt(value, 4);
}

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (err) {
    throw new Error(`cannot reach the server (${err.message})`);
  }
  let data = null;
  try {
    data = await resp.json();
  } catch (err) {
    data = null;
  }
  if (!resp.ok) {
    const message = data && typeof data.error === "string" ? data.error : `HTTP ${resp.status} ${resp.statusText}`;
    throw new Error(data && data.field ? `${message} (field: ${data.field})` : message);
  }
  if (data === null) throw new Error(`the server answered ${path} without JSON`);
  return data;
}

function showError(message) {
  const box = $("error");
  box.textContent = message || "";
  box.hidden = !message;
}

function fillSelect(select, values, chosen) {
  select.replaceChildren(...values.map((value) => {
    const option = el("option", {value}, value);
    option.selected = String(value) === String(chosen);
    return option;
  }));
}

function showVersion(version) {
  const parts = [`knowledge source v${version}`];
  if (knowledge) {
    parts.push(`${knowledge.passages.toLocaleString("en")} passages`, `encoder ${knowledge.encoder}`);
    if (version !== knowledge.version) parts.push(`(reloaded; was v${knowledge.version} at start)`);
  }
  $("version").textContent = parts.join(" · ");
  if (knowledge) $("version").title = knowledge.path;
}

function showInfo(info) {
  knowledge = info.knowledge;
  fillSelect($("decoding"), info.decodings, info.default_decoding);
  fillSelect($("k"), Array.from({length: info.max_k}, (_, i) => i + 1), info.k);
  const file = String(info.model).split("/").pop();
  $("model").textContent = `model ${info.arch} (${VARIANTS[info.variant] || info.variant}) · ${file}`;
  $("model").title = info.model;
  showVersion(knowledge.version);
}

function passageText(text) {
  const para = el("p", {class: "text"});
  const long = text.length > SHORT_TEXT;
  const short = long ? `${text.slice(0, SHORT_TEXT).replace(/\s+\S*$/, "")} …` : text;
  const body = el("span", {class: "body"}, short);
  para.append(body);
  if (long) {
    const button = el("button", {type: "button", class: "more", "aria-expanded": "false"}, "more");
    button.addEventListener("click", () => {
      const open = button.getAttribute("aria-expanded") !== "true";
      body.textContent = open ? text : short;
      button.textContent = open ? "less" : "more";
      button.setAttribute("aria-expanded", String(open));
    });
    para.append(" ", button);
  }
  return para;
}

function scoreItem(label, shown) {
  const item = el("span", {class: "score"});
  item.append(el("span", {class: "label"}, label), " ", el("b", {}, shown));
  return item;
}

function passageItem(p, i, coloured) {
  const li = el("li", {class: "passage", "data-rank": p.rank});
  const head = el("div", {class: "passage-head"});
  if (coloured) head.append(swatch(i));
  head.append(el("span", {class: "rank"}, p.rank + 1), el("strong", {class: "title"}, p.title),
    el("span", {class: "pid"}, p.id));
  const bar = el("span", {class: "prior-bar", title: `p(z|x) = ${fmtProb(p.prior)}`});
  bar.style.width = `${Math.max(0, Math.min(1, p.prior)) * 100}%`;
  const scores = el("div", {class: "scores"});
  scores.append(scoreItem("retrieval", fmt(p.retrieval_score, 3)), scoreItem("prior p(z|x)", fmtProb(p.prior)),
    scoreItem("posterior p(z|x,y)", fmtProb(p.posterior)));
  li.append(head, scores, el("div", {class: "prior-track"}), passageText(p.text));
  li.querySelector(".prior-track").append(bar);
  return li;
}

function pieceText(piece) {
  // SentencePiece marks a word start with "▁": shown as a plain word, the column flagged as a word start
  const text = piece.startsWith("▁") ? piece.slice(1) : piece;
  return text === "" ? "␣" : text;
}

function heatHead(tokens) {
  const row = el("tr");
  row.append(el("th", {scope: "col", class: "corner"}, "passage \\ token"));
  tokens.forEach((piece) => {
    row.append(el("th", {scope: "col", class: piece.startsWith("▁") ? "piece ws" : "piece", title: piece},
      pieceText(piece)));
  });
  const head = el("thead");
  head.append(row);
  return head;
}

function heatBody(tp, titles) {
  const body = el("tbody");
  tp.posterior.forEach((values, k) => {
    const row = el("tr", {"data-passage": k});
    const name = el("th", {scope: "row", title: titles[k]});
    name.append(swatch(k), el("span", {}, `${k + 1} ${titles[k]}`));
    row.append(name);
    values.forEach((value, t) => {
      const v = Math.max(0, Math.min(1, Number(value)));
      const cell = el("td", {"data-value": value, title: `${titles[k]} · ${tp.tokens[t]}: ${fmtProb(v)}`},
        fmt(v, 2));
      cell.style.backgroundColor = `rgba(${HEAT_RGB}, ${v.toFixed(3)})`;
      if (v > 0.55) cell.classList.add("dark");
      row.append(cell);
    });
    body.append(row);
  });
  return body;
}

function argmaxColumn(posterior, t) {
  let best = 0;
  posterior.forEach((row, k) => {
    if (row[t] > posterior[best][t]) best = k;
  });
  return best;
}

function drawTokens(tp, titles) {
  const best = tp.tokens.map((_, t) => argmaxColumn(tp.posterior, t));
  const line = $("answer-tokens");
  line.replaceChildren();
  tp.tokens.forEach((piece, t) => {
    const k = best[t];
    const span = el("span", {class: t > 0 && piece.startsWith("▁") ? "tok ws" : "tok", "data-passage": k,
      title: `${piece} ← passage ${k + 1} "${titles[k]}" (${fmt(tp.posterior[k][t], 3)})`}, pieceText(piece));
    span.style.backgroundColor = passageColour(k);
    line.append(span);
  });
  $("legend").replaceChildren(...titles.map((title, k) => {
    const carried = best.filter((b) => b === k).length;
    const item = el("li", {"data-passage": k});
    item.append(swatch(k), el("span", {}, `${k + 1} ${title}`),
      el("span", {class: "count"}, ` ${carried} token${carried === 1 ? "" : "s"}`));
    return item;
  }));
}

function drawPosterior(tp, passages) {
  const shown = Boolean(tp && tp.tokens && tp.tokens.length);
  $("posterior").hidden = !shown;
  $("answer-tokens").hidden = !shown;
  if (!shown) {
    $("heatmap").replaceChildren();
    $("answer-tokens").replaceChildren();
    $("legend").replaceChildren();
    return;
  }
  const titles = tp.posterior.map((_, k) => (passages[k] ? passages[k].title : `passage ${k + 1}`));
  $("heatmap").replaceChildren(heatHead(tp.tokens), heatBody(tp, titles));
  drawTokens(tp, titles);
}

function drawResult(r) {
  $("answer").textContent = r.answer;
  $("score").textContent = `score ${fmt(r.score, 3)}`;
  $("result-meta").textContent = `decoding ${r.decoding} · K = ${r.k} · knowledge source v${r.knowledge_version}`
    + ` · ${fmt(r.elapsed_ms, 0)} ms`;
  showVersion(r.knowledge_version);
  const coloured = Boolean(r.token_posterior);
  $("passages").replaceChildren(...r.passages.map((p, i) => passageItem(p, i, coloured)));
  drawPosterior(r.token_posterior, r.passages);
  $("result").hidden = false;
}

function setBusy(busy) {
  $("ask").disabled = busy;
  $("ask").textContent = busy ? "Asking…" : "Ask";
  document.body.dataset.state = busy ? "busy" : document.body.dataset.state;
}

async function ask(event) {
  event.preventDefault();
  const body = {question: $("question").value, explain: true};
  if ($("k").value) body.k = Number($("k").value);
  if ($("decoding").value) body.decoding = $("decoding").value;
  setBusy(true);
  showError("");
  let state = "answer";
  try {
    drawResult(await api("v1/answer", body));
  } catch (err) {
    state = "error";
    $("result").hidden = true;
    showError(err.message);
  } finally {
    setBusy(false);
    requests += 1;
    document.body.dataset.state = state;
    document.body.dataset.requests = String(requests);
  }
}

async function init() {
  $("ask-form").addEventListener("submit", ask);
  try {
    showInfo(await api("v1/info"));
  } catch (err) {
    showError(`cannot read the server's info: ${err.message}`);
  }
  document.body.dataset.ready = "true";
}

document.addEventListener("DOMContentLoaded", init);
