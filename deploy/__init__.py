"""Serving a class: deploy/run_class.sh and deploy/haproxy.cfg, and the hosting checks in
deploy/checks/ (run by hand, outside CI)."""
