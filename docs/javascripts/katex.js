// KaTeX, served from the site itself (docs/vendor/katex), typesets the maths that pymdownx.arithmatex (generic
// mode) marked: each .arithmatex element holds \( ... \) inline or \[ ... \] on its own line. Run on every page
// load, including the instant navigation of mkdocs-material. A formula KaTeX cannot parse is shown in red with
// its error (throwOnError: false) rather than stopping the others.
document$.subscribe(({ body }) => {
  for (const element of body.querySelectorAll(".arithmatex")) {
    const source = element.textContent.trim();
    const display = source.startsWith("\\[");
    const tex = source.replace(/^\\[\(\[]/, "").replace(/\\[\)\]]$/, "");
    katex.render(tex, element, { displayMode: display, throwOnError: false });
  }
});
