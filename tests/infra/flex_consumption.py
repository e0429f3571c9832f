"""What Azure Functions' Flex Consumption plan refuses or ignores, which the template must not set.

From Microsoft's "Flex Consumption plan deprecations" table
(https://learn.microsoft.com/azure/azure-functions/functions-app-settings#flex-consumption-plan-deprecations:
"these site properties and application settings are deprecated and shouldn't be used when creating function
app resources"). ARM refuses some of them outright, BadRequest 51021 "... for Flex Consumption sites is
invalid. Please remove or rename it" (on the stamps that enforce it): ``ftpsState``, ``use32BitWorkerProcess``,
``netFrameworkVersion`` and ``functionsRuntimeScaleMonitoringEnabled`` (microsoft/azure-pipelines-tasks#21032),
``linuxFxVersion`` (Azure/terraform-azurerm-avm-res-web-site#283, #345), ``preWarmedInstanceCount``
(Azure/terraform-azurerm-avm-res-web-site#360), ``functionAppScaleLimit`` (Azure/azure-functions-host#10643).
The rest are replaced by ``functionAppConfig`` or ignored. ``http20Enabled`` is not on the table, but Flex
documents no such setting and the portal hides it for Flex apps: left out too.
"""

from __future__ import annotations

# Site properties, as set under properties or properties.siteConfig (compared without case).
REFUSED_PROPERTIES = frozenset(name.lower() for name in (
    "ftpsState", "use32BitWorkerProcess", "netFrameworkVersion", "functionsRuntimeScaleMonitoringEnabled",
    "linuxFxVersion", "preWarmedInstanceCount", "functionAppScaleLimit",
))
IGNORED_PROPERTIES = frozenset(name.lower() for name in (
    "alwaysOn", "containerSize", "dnsConfiguration", "isReserved", "isXenon", "javaVersion", "powerShellVersion",
    "vnetBackupRestoreEnabled", "vnetContentShareEnabled", "vnetImagePullEnabled", "vnetRouteAllEnabled",
    "windowsFxVersion", "http20Enabled",
))
# App settings (the Flex page adds WEBSITE_TIME_ZONE, TZ and WEBSITE_LOAD_CERTIFICATES as not supported).
APP_SETTINGS = frozenset((
    "ENABLE_ORYX_BUILD", "FUNCTIONS_EXTENSION_VERSION", "FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_WORKER_RUNTIME_VERSION",
    "FUNCTIONS_MAX_HTTP_CONCURRENCY", "FUNCTIONS_WORKER_PROCESS_COUNT", "FUNCTIONS_WORKER_DYNAMIC_CONCURRENCY_ENABLED",
    "SCM_DO_BUILD_DURING_DEPLOYMENT", "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING", "WEBSITE_CONTENTOVERVNET",
    "WEBSITE_CONTENTSHARE", "WEBSITE_DNS_SERVER", "WEBSITE_MAX_DYNAMIC_APPLICATION_SCALE_OUT",
    "WEBSITE_NODE_DEFAULT_VERSION", "WEBSITE_RUN_FROM_PACKAGE", "WEBSITE_SKIP_CONTENTSHARE_VALIDATION",
    "WEBSITE_VNET_ROUTE_ALL", "WEBSITE_TIME_ZONE", "TZ", "WEBSITE_LOAD_CERTIFICATES",
))


def site_findings(site: dict, settings: dict) -> list[str]:
    """What a Flex Consumption site's body (evaluated) and its app settings set that Flex refuses or ignores."""
    properties = site.get("properties", {})
    found = [f"properties.{name} is refused by Flex Consumption" if name.lower() in REFUSED_PROPERTIES else
             f"properties.{name} is ignored by Flex Consumption"
             for name in properties if name.lower() in REFUSED_PROPERTIES | IGNORED_PROPERTIES]
    config = properties.get("siteConfig", {})
    found += [f"properties.siteConfig.{name} is refused by Flex Consumption" if name.lower() in REFUSED_PROPERTIES
              else f"properties.siteConfig.{name} is ignored by Flex Consumption"
              for name in (config if isinstance(config, dict) else {})
              if name.lower() in REFUSED_PROPERTIES | IGNORED_PROPERTIES]
    found += [f"app setting {name} is not used by Flex Consumption" for name in settings if name in APP_SETTINGS]
    return found
