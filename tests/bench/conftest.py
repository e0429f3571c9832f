from tests.support.cosmos import cosmos_endpoint  # noqa: F401 - the Cosmos endpoint fixture, for bench.calibrate
