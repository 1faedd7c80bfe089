"""This node's pods, as the API server knows them: a watched cache with a GET fallback."""
