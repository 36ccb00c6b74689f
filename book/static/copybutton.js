// A "copy" button on each block of code (a cell's input, a command in the text): what a learner pastes into a
// terminal or a notebook. The site's own script, so a page fetches nothing from elsewhere; it works opened as files
// too (file://), where the clipboard API may be missing: then the text is selected for Ctrl+C instead.
document.addEventListener("DOMContentLoaded", () => {
  for (const block of document.querySelectorAll("div.highlight")) {
    if (block.closest(".cell_output")) continue;  // what a run printed is not something to paste
    const button = document.createElement("button");
    button.className = "lessons-copy";
    button.type = "button";
    button.textContent = "copy";
    button.addEventListener("click", () => {
      const text = block.querySelector("pre").innerText;
      const said = (word) => { button.textContent = word; setTimeout(() => { button.textContent = "copy"; }, 1500); };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(() => said("copied"), () => said("select"));
      } else {
        const range = document.createRange();
        range.selectNodeContents(block.querySelector("pre"));
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        said("selected");
      }
    });
    block.appendChild(button);
  }
});
