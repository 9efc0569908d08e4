"""zhpipe stages: one module per stage, pure logic plus a thin Prefect `@task` wrapper."""
