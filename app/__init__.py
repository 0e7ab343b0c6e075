"""ANVE desktop: the Qt front end. It talks to the worker over HTTP only and imports
nothing of the engine except ``engine.protocol``."""
