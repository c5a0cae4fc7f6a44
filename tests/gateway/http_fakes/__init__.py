"""Fakes for the streamable-HTTP relay's tests: a scripted upstream, an interceptor, a catalog."""
