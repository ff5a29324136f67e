"""The views stage: every string a page shows, formatted into view models (pages, pictures, diagrams, search,
the JSON twin), so templates hold no arithmetic."""
