from tests.support.cosmos import cosmos_endpoint  # noqa: F401
