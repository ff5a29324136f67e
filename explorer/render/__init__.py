"""The render stage: view models written to files with Jinja2 and the site swapped in whole."""
