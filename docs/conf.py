# Sphinx configuration of the torch-vnpu documentation (`make docs` -> out/docs).
# Sphinx, as PyTorch and torch_npu use: autodoc builds the API reference from the docstrings, and MyST reads the
# Markdown pages as they are on GitHub.
project = "torch-vnpu"
author = "torch-vnpu developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
html_theme = "alabaster"
html_static_path = []
autodoc_member_order = "bysource"
suppress_warnings = ["myst.header"]  # pages that start at a second-level heading inside an included file
