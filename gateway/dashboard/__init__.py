"""The web dashboard under /dashboard: server-rendered pages (Jinja2) over the same store the REST API
reads, for one tenant at a time. session.py signs the login cookie and the CSRF tokens, bars.py turns a
ContextReport into the stacked bar, views.py shapes records for the templates, pages.py holds the
routes."""
