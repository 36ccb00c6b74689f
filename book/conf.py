"""Sphinx's settings for the course's site (book/build.py stages the sources and runs Sphinx with these).

The notebooks are shown as committed, outputs and figures included: never executed here (the tests execute them).
Nothing is fetched when a page is read: the widgets' JavaScript is served from the site itself.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # anchors.py

project = "DDP Lessons"
author = "DDP Lessons"
extensions = ["myst_nb"]
root_doc = "index"
# Only these pages; every other staged file (scripts, exercises) is a download a page links to.
include_patterns = ["index.md", "CHEATSHEET.md", "GPU_DAY_ONE.md", "notebooks/*.ipynb", "notebooks/gpu_report.md",
                    "exercises/README.md", "exercises/find_the_hang/README.md", "ddp_scripts/README.md", "TESTING.md",
                    "CONTRIBUTING.md", "benchmarks/LOG.md"]
exclude_patterns = ["_build"]

nb_execution_mode = "off"  # the committed outputs, as they are
nb_merge_streams = True
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 4


myst_heading_slug_func = "anchors.jupyterlab_slug"  # book/anchors.py

html_theme = "sphinx_book_theme"
html_title = "DDP Lessons"
html_static_path = [str(Path(__file__).resolve().parent.parent / "build" / "site-source" / "_static")]  # build.py
html_theme_options = {"home_page_in_toc": True, "show_toc_level": 2, "use_download_button": False,
                      "use_fullscreen_button": False}
html_context = {"default_mode": "light"}  # the theme logs an error on a page without a mode
html_show_sourcelink = False
html_last_updated_fmt = None
html_copy_source = False
# ipywidgets: require.js and the widget manager from this site, not from a CDN (book/build.py copies them).
# No crossorigin attribute: opened as files (file://), Chromium refuses a CORS load of embed-amd.js for the "null"
# origin, and the widgets never drew; a plain script tag loads it from the site, served or opened.
nb_ipywidgets_js = {"require.js": {}, "embed-amd.js": {"data-jupyter-widgets-cdn": ""}}
# The site's own CSS (outputs wrap) and a copy button on code (book/static/, staged into _static by build.py).
html_css_files = ["lessons.css"]
html_js_files = ["copybutton.js"]
# A %%writefile cell of a shell script is lexed as Python, and shown plain: not a fault of the page.
suppress_warnings = ["mystnb.unknown_mime_type", "misc.highlighting_failure"]
