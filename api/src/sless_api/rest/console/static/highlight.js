// Source view: a small tokenizer for Python, JavaScript and Go that colours keywords, strings, numbers and
// comments. It builds text nodes inside spans, so a file's content can never become markup.
"use strict";
import { el } from "./api.js";

const KEYWORDS = new Set(("def return if elif else for while in import from as class try except finally raise with " +
  "async await lambda None True False pass break continue yield not and or is function const let var new this " +
  "throw catch typeof exports require module package func go defer chan map struct interface type range nil " +
  "switch case default select").split(" "));

const TOKEN = /(#[^\n]*|\/\/[^\n]*|\/\*[\s\S]*?\*\/)|("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)|(\b\d+(?:\.\d+)?\b)|([A-Za-z_]\w*)/g;

export function highlight(code) {
  const pre = el("pre", { class: "code" });
  let last = 0;
  for (const m of code.matchAll(TOKEN)) {
    pre.append(code.slice(last, m.index));
    const [text, com, str, num, word] = m;
    if (com) pre.append(el("span", { class: "tok-com" }, text));
    else if (str) pre.append(el("span", { class: "tok-str" }, text));
    else if (num) pre.append(el("span", { class: "tok-num" }, text));
    else if (word && KEYWORDS.has(word)) pre.append(el("span", { class: "tok-kw" }, text));
    else pre.append(text);
    last = m.index + text.length;
  }
  pre.append(code.slice(last));
  return pre;
}
