"""fa4-aot's artifact service: serves a kernel store over HTTP to a cluster.

The database holds metadata and digests; object bytes live only in the content-addressed store on disk
(fa4_aot.store.Store). Entry points for the CLI: config.Settings, main.create_app, main.serve, db.migrate,
db.session_for, crud_tokens.create_token, crud_tokens.rotate_token, crud_tokens.revoke_token.
"""
