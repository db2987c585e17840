"""From files, folders and JSONL lines to submissions: which problem each targets, and the Python source
extracted from raw model output (extract.py).

Runs in: the parent. Reads submissions as text; never imports or executes them.
May import: shared.
"""
