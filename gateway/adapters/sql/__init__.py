"""The SQL store: SQLModel tables over SQLite (embedded default) or Postgres (scale-out)."""
