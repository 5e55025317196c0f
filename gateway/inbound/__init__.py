"""Front doors other than chat completions: each API's request turned into the pipeline's chat form, and
the chat answer (JSON or stream) turned back into that API's wire format. Pure functions over JSON: no
HTTP types, no SDK types; the HTTP edge (`http/doors.py`) calls them."""
