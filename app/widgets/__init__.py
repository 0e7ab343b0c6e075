"""Views: they show the models and call the controllers; no I/O of their own."""
