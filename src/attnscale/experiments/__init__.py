"""One module per experiment of the chapter: spread, fresh, dynamics, sweep."""
