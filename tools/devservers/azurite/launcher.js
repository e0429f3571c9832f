// Azurite (npm `azurite`, pinned in package.json) as the local stack runs it: the same process as
// `azurite`, which also exits when its stdin closes, so that it never outlives the Python process that
// started it (the local Cosmos server's launcher does the same).
"use strict";
if (process.argv.includes("--exit-on-stdin-close")) {
  process.argv = process.argv.filter((arg) => arg !== "--exit-on-stdin-close");
  process.stdin.on("end", () => process.exit(0));
  process.stdin.resume();
}
require("azurite/dist/src/azurite.js");
