"""Long-term user memory: atomic memories extracted in the background, resolved against what is known,
searched for each request (the memory context section), and fully under the user's control (the API)."""
