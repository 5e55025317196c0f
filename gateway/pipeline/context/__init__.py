"""The context builder: independent sections proposing content under one token budget."""
