"""A script appended to the self-contained report pages: once the page has loaded, it counts the figures
the browser decoded, logs a console error for each that did not, and records "loaded/total" on the body
(`data-figures-loaded`). The headless-browser test reads both (tests/experiments/test_report_browser.py)."""

from __future__ import annotations

FIGURE_CHECK_SCRIPT = """<script>
window.addEventListener("load", () => {
  const figures = Array.from(document.images);
  const loaded = figures.filter((img) => img.complete && img.naturalWidth > 0);
  figures.filter((img) => !loaded.includes(img)).forEach((img) => console.error("figure did not load: " + img.alt));
  document.body.dataset.figuresLoaded = loaded.length + "/" + figures.length;
});
</script>"""
