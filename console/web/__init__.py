"""The console's pages, templates and static files."""
