"""Hosting checks, run by hand outside CI (``python deploy/checks/X.py --help``): load
(browser sessions against one server), proxy_check (sticky sessions through HAProxy),
memory_waves (memory after a class leaves), browser_floor (what one browser session costs).
Shared helpers: common (paths, results, /proc readings) and browser (Chromium and the page's
steps). Nothing here imports bench/ (benchmarks only) and bench/ imports nothing from here."""
