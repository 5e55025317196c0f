"""The HTTP edge: routes, middleware, SSE responses and error mapping. No domain logic lives here."""
