"""From records to what people read: pure scoring and the leaderboard (scoring.py), the terminal tables
(console.py, the only user of rich) and the HTML report with its plots (html.py).

Runs in: the parent; needs records only (no CUDA, no child processes).
May import: shared, integrity.
"""
