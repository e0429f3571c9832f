#!/usr/bin/env node
/*
 * Local Cosmos DB (NoSQL API) server for tests and workstation runs. Not deployed.
 *
 *   node devservers/cosmos/launcher.js --port 8081 [--host 127.0.0.1] [--verbose]
 *
 * Serves plain HTTP (clients need enable_endpoint_discovery=False); --port 0 picks a free port. When
 * ready it prints exactly one line to stdout: `listening on http://HOST:PORT`. SIGTERM/SIGINT stop it.
 * With --verbose it writes one line per request to stderr: the operation, method, path, status and
 * milliseconds, never a body.
 * With --exit-on-stdin-close it also stops when its stdin closes, so a parent that dies without
 * cleaning up (e.g. a killed pytest) does not leave it running.
 *
 * The server is npm @vercel/cosmosdb-server, pinned at exactly 1.0.1 (package.json). As published it
 * differs from real Cosmos DB in ways our tests depend on, so before its route table is built this
 * launcher patches the package's modules in memory (node_modules is never edited):
 *
 *   1. reading a missing/deleted document crashes with a TypeError (500) instead of 404;
 *   2. transactional batch is not atomic, fails with 500 for every operation but Create (the Python
 *      SDK sends the partition key once, in the request header, and none on each operation), and
 *      rejects Patch operations with 400 (corrected with an undo journal, so that a batch costs the
 *      same whatever the container's size);
 *   3. TTL (container defaultTtl and item `ttl`) is not implemented;
 *   4. a query with a partition key header is not restricted to that partition;
 *   5. a patch filter predicate is lower-cased before it is evaluated ("c.Version" -> "c.version");
 *   6. the CLI answers every request with `connection: close` (~36 creates/s from Python);
 *   7. it accepts what Cosmos refuses: a container defaultTtl or item `ttl` other than -1 or
 *      1..2147483647, ids over 255 characters or with / or \ in them (and ? or #, which the service
 *      stores but the Python SDK then cannot address by id: refused here too), partition key values
 *      over 2,048 bytes, items over 2 MB; a patch of more than 10 operations it did refuse, but only
 *      once the document was found and its filter predicate held (404 and 412 came first). It answers
 *      a query or read feed without x-ms-max-item-count in one page, every row at once, and any page
 *      whatever its size, where Cosmos sends at most 100 items when the header is absent (the SDK
 *      sends none without max_item_count) and at most 4 MB of them in any page (-1: as many as fit),
 *      the rest through x-ms-continuation. And it ignores `Prefer: return=minimal` (the SDK's
 *      no_response=True), answering with the whole document instead of an empty body;
 *      A set or add at a path whose parent object is missing (`/payment/review` on a document without
 *      `payment`) it carried out at the wrong place, the root (its path walk takes the missing parent for the
 *      last segment), where Cosmos answers 400 "Add Operation can only create a child object of an existing
 *      node" and writes nothing;
 *   8. the change feed is a stub: with `A-IM: Incremental feed` the first read returns every document
 *      and any read with a continuation answers 304, so a reader never sees a later change;
 *   9. a request costs what the whole container does, where Cosmos's indexes make it cost what it
 *      touches: its query engine copies its accumulator for every document (`[...$, row]`), so that
 *      every query over the container was O(N^2); every page of a paged query ran the whole query
 *      again; and this launcher's own corrections 3. and 4. scanned or copied every document before
 *      each query. With 40,000 documents in 10,000 partitions (the chaos run's orders container) a
 *      targeted cross-partition query took 34 s and a partition-scoped one 40 ms. That is the likely
 *      cause of the chaos run's stalled drains (a point query waited over 65 s, 349 connections
 *      queued to be accepted, node at high CPU): its outbox sweep (every 10 s, in each of 4 hosts) and
 *      the driver's drain polls query across partitions, more often than such queries finish.
 *      Corrected with per-partition and _rid-order indexes and an expiry schedule kept in the write
 *      primitives, paged queries resumed at their continuation, and the engine's accumulators appended
 *      in place (9. below). Measured with `python -m devservers.cosmos.measure`, median ms per
 *      operation, on this repository's 2-core machine with another session's work on it (repeated
 *      runs differed by up to 2x):
 *
 *                                           before:  0    10,000      40,000 | after:  0  10,000  40,000
 *        point read                                3.0       2.1         7.5 |       1.9     1.7     1.2
 *        create                                    3.6       2.1         4.5 |       1.5     1.7     1.3
 *        transactional batch of 3                  3.0       2.1         5.0 |       1.8     2.0     1.4
 *        partition-scoped query                    2.5       8.8        39.5 |       2.0     2.1     2.1
 *        targeted cross-partition query            3.0     147.8    34,319.2 |       2.1    10.1    39.5
 *        SELECT VALUE COUNT(1) ... type='order'    3.2     144.0    14,197.8 |       2.6     8.6    31.4
 *        SELECT * FROM c, pages of 1,000           4.9   1,936.4   ~670,792  |       5.3   181.1   597.5
 *
 *      (~: extrapolated from its first 60 s.) What remains O(N) is a cross-partition scan itself (no
 *      property index), and ORDER BY, TOP and aggregates, which evaluate their whole scope per page;
 *      since 7. pages every query (100 items unless the request says otherwise), reading an ORDER BY
 *      or TOP query to its end costs its scope once per page. The "after" figures predate 7.'s page
 *      limits; measured since side by side with the launcher without them (same machine, same time,
 *      both slowed by other work on it), no operation was slower beyond the run-to-run spread (a full
 *      read of 40,000 in pages of 1,000: 1,362 ms with them, 2,521 ms without).
 * Also: error bodies are given Cosmos' {"code", "message"} shape, document routes on a missing
 * container answer 404 instead of crashing, and replacing a container keeps its documents.
 *
 * All of this relies on internals of 1.0.1 (module layout, the Items class with its _data/_index maps
 * and its _set/delete primitives, operation result shapes) and of its query engine
 * @zeit/cosmosdb-query 0.7.2 (the compiled syntax tree, the executor and helpers modules, the
 * continuation token), hence the exact pins and the version checks below. Re-read both packages' lib/
 * before changing a version.
 */
"use strict";

const path = require("path");

const PACKAGE = "@vercel/cosmosdb-server";
const PINNED_VERSION = "1.0.1";
const QUERY_PACKAGE = "@zeit/cosmosdb-query"; // the package's query engine (its dependency)
const QUERY_PINNED_VERSION = "0.7.2";
const MAX_BATCH_OPERATIONS = 100; // Cosmos limits a transactional batch to 100 operations...
const MAX_BATCH_BYTES = 2 * 1024 * 1024; // ...and 2 MB.
const MAX_ITEM_BYTES = 2 * 1024 * 1024; // An item is at most 2 MB of JSON...
const MAX_ID_LENGTH = 255; // ...and its id at most 255 characters, none of them / \ ? or #...
const ID_FORBIDDEN = /[/\\?#]/;
const MAX_PARTITION_KEY_BYTES = 2048; // ...and its partition key value at most 2,048 bytes (large partition keys).
const MAX_PATCH_OPERATIONS = 10; // A patch (point or in a batch) has at most 10 operations.
const DEFAULT_PAGE_ITEMS = 100; // A query page without x-ms-max-item-count holds at most 100 items...
const MAX_PAGE_BYTES = 4 * 1024 * 1024; // ...and any page at most 4 MB of them (but always at least one).
const MAX_TTL = 2147483647; // defaultTtl and ttl: -1 or 1 to 2^31 - 1 seconds.

function fail(message) {
  process.stderr.write(`cosmos launcher: ${message}\n`);
  process.exit(1);
}

// ---------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------
function parseArgs(argv) {
  const args = { host: "127.0.0.1", port: 8081, exitOnStdinClose: false, verbose: false };
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i];
    if (arg === "--port" || arg === "-p") args.port = Number(argv[(i += 1)]);
    else if (arg === "--host") args.host = argv[(i += 1)];
    else if (arg === "--exit-on-stdin-close") args.exitOnStdinClose = true;
    else if (arg === "--verbose") args.verbose = true;
    else if (arg === "--help" || arg === "-h") {
      process.stdout.write("usage: launcher.js [--port N (0 = any free port)] [--host 127.0.0.1] [--exit-on-stdin-close]" +
        " [--verbose]\n");
      process.exit(0);
    } else fail(`unknown argument ${arg}`);
  }
  if (!Number.isInteger(args.port) || args.port < 0 || args.port > 65535) fail("--port needs 0-65535");
  if (!args.host) fail("--host needs a value");
  return args;
}

// ---------------------------------------------------------------------------------------------
// Loading the pinned package
// ---------------------------------------------------------------------------------------------
function locatePackage() {
  let pkgJson;
  try {
    pkgJson = require.resolve(`${PACKAGE}/package.json`, { paths: [__dirname] });
  } catch (err) {
    fail(`${PACKAGE} is not installed; run \`npm ci --prefix devservers/cosmos\` (${err.message})`);
  }
  const { version } = require(pkgJson);
  if (version !== PINNED_VERSION) {
    fail(`${PACKAGE} ${version} is installed but this launcher patches internals of ${PINNED_VERSION} only; ` +
      "run `npm ci --prefix devservers/cosmos`");
  }
  return path.join(path.dirname(pkgJson), "lib");
}

// The package's query engine, whose internals 9. patches too: the copy lib/account/items.js loads.
function locateQueryEngine(serverLib) {
  const pkgJson = require.resolve(`${QUERY_PACKAGE}/package.json`, { paths: [path.join(serverLib, "account")] });
  const { version } = require(pkgJson);
  if (version !== QUERY_PINNED_VERSION) {
    fail(`${QUERY_PACKAGE} ${version} is installed but this launcher patches internals of ${QUERY_PINNED_VERSION} ` +
      "only; run `npm ci --prefix devservers/cosmos`");
  }
  return path.join(path.dirname(pkgJson), "lib");
}

const ARGS = parseArgs(process.argv.slice(2));
const LIB = locatePackage();
const QUERY_LIB = locateQueryEngine(LIB);
const load = rel => require(path.join(LIB, rel));
const loadQuery = rel => require(path.join(QUERY_LIB, rel));

// Every patch below must be in place before lib/routes.js runs: it copies each handler's
// `exports.default` into the route table when it is first required (by lib/index.js).
if (require.cache[require.resolve(path.join(LIB, "routes"))]) fail("routes loaded before patching");

const router = load("router");
const documentOps = load("handler/_document-operations");
const patchOps = load("handler/_patch-operations");
const readItems = load("handler/_read-items").default;
const readJson = load("json").default;
const trueHeader = load("true-header").default;
const partitionHeader = load("utils/get-partition-from-header");
const getValue = load("utils/get-value").default;
const Items = load("account/items").default;
const Documents = load("account/documents").default;
const Collections = load("account/collections").default;
const queryTransformer = loadQuery("transformer");
const queryExecutor = loadQuery("executor");
const queryHelpers = loadQuery("helpers");
const aggregateFunctions = loadQuery("aggregate-functions");
const builtinFunctions = loadQuery("builtin-functions");
const continuationToken = loadQuery("continuation-token");

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------
const ERROR_CODES = {
  400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
  412: "PreconditionFailed", 413: "RequestEntityTooLarge", 424: "FailedDependency", 500: "InternalServerError",
};
const NOT_FOUND_MESSAGE = "Entity with the specified id does not exist in the system.";

function errorResult(statusCode, message) {
  return { statusCode, body: { code: ERROR_CODES[statusCode] || "Error", message } };
}

/** Thrown by the model (see 7.) and turned into an error answer with this status wherever it is caught. */
class CosmosError extends Error {
  constructor(statusCode, message) {
    super(message);
    this.statusCode = statusCode;
  }
}

/**
 * The partition a request targets, from its x-ms-documentdb-partitionkey header (a JSON array such
 * as ["abc"]); undefined when none is given. `{}` in the array is the SDK's "undefined" key (documents
 * without the property). Like the package itself, only the first partition-key path is supported.
 */
function requestPartition(req) {
  const raw = partitionHeader.default(req);
  if (!raw) return undefined;
  let parsed;
  try {
    parsed = JSON.parse(raw);
  } catch (err) {
    return undefined;
  }
  if (Array.isArray(parsed)) {
    if (parsed.length === 0) return undefined; // "Empty" key of migrated containers: no filter
    [parsed] = parsed;
  }
  const isUndefinedKey = parsed !== null && typeof parsed === "object" && Object.keys(parsed).length === 0;
  return { value: isUndefinedKey ? undefined : parsed };
}

function inPartition(documents, doc, partition) {
  return documents._getPartition(doc) === partition.value;
}

// ---------------------------------------------------------------------------------------------
// 3. TTL. Items (account/items.js) keeps documents in two maps: _data (rid -> Document) and _index
// ("partition:keyPath:value" -> rid). Expiry is lazy: a document past its TTL is evicted from both
// maps (and from the indexes of 9.) the moment anything looks it up (_item: reads, replace, patch,
// delete, batch, and the unique-key check of create, so an id can be created again once its holder
// expired), and before every query and read feed the versions whose time has come are taken from the
// expiry schedule of 9. and evicted, so that a scan never returns them. Items already stamps _ts
// (seconds) on every write.
// ---------------------------------------------------------------------------------------------
function effectiveTtl(documents, doc) {
  const container = documents._parent.read();
  const defaultTtl = container ? container.defaultTtl : undefined;
  // TTL is off for the container unless defaultTtl is set (-1 = on, no default); then an item's own
  // numeric `ttl` overrides the default. -1 means never expire.
  if (defaultTtl === undefined || defaultTtl === null) return null;
  const ttl = typeof doc.ttl === "number" ? doc.ttl : defaultTtl;
  return ttl > 0 ? ttl : null;
}

function isExpired(documents, doc) {
  const ttl = effectiveTtl(documents, doc);
  return ttl !== null && typeof doc._ts === "number" && Date.now() / 1000 >= doc._ts + ttl;
}

// What Items.delete does once it has found the document (calling Items.delete itself would
// re-enter the _item override below).
function evict(documents, doc) {
  documents._uniqueKeyPaths.forEach(keyPath => {
    const value = getValue(keyPath.slice(1).split("/"), doc);
    documents._index.delete(documents._getId(keyPath, value, documents._getPartition(doc)));
  });
  documents._data.delete(doc._rid);
  unindex(documents, doc); // 9.
}

/** Evicts every current version whose expiry time has come, as the schedule of 9. lists them. */
function purgeExpired(documents) {
  const { expiry } = indexes(documents);
  const now = Date.now() / 1000;
  while (expiry.length > 0 && expiry[0].at <= now) {
    const { doc } = heapPop(expiry);
    if (isCurrent(documents, doc) && isExpired(documents, doc)) evict(documents, doc);
  }
}

const baseItem = Items.prototype._item;
Documents.prototype._item = function itemUnlessExpired(keyPath, value, partition) {
  const item = baseItem.call(this, keyPath, value, partition);
  const doc = item.read();
  if (doc && isExpired(this, doc)) {
    evict(this, doc);
    return this._newItem(); // an empty Document: read() gives undefined, i.e. "not found"
  }
  return item;
};

// 4. and 9. Items.query and Items.read scan every document of the container. Both now go through
// runQuery (9.): with options.partition only that partition's documents are scanned, from its index.
Documents.prototype.query = function queryIndexed(params, options = {}) {
  if (!this._parent.read()) return null;
  purgeExpired(this);
  return runQuery(this, params.query, params.parameters, options);
};

Documents.prototype.read = function readIndexed({ maxItemCount, continuation } = {}) {
  if (!this._parent.read()) return null;
  purgeExpired(this);
  return runQuery(this, "SELECT * FROM c", undefined, { maxItemCount, continuation });
};

// Replacing a container (e.g. to change its defaultTtl) goes through Items.replace, which stores a
// brand-new Collection object, with new, empty Documents: every document was silently dropped.
// Hand the old object's documents and functions over to the new one. Its defaultTtl may have changed,
// and with it every document's expiry time: the expiry schedule (9.) is made again.
const baseReplace = Items.prototype.replace;
Collections.prototype.replace = function replaceKeepingDocuments(data, original) {
  checkContainer(data); // 7.
  const old = this._item("/id", original.id, original.id);
  const result = baseReplace.call(this, data, original);
  const replacement = this._item("/id", result.id, result.id);
  for (const part of ["documents", "userDefinedFunctions"]) {
    replacement[part] = old[part];
    replacement[part]._parent = replacement;
  }
  rescheduleExpiry(replacement.documents);
  return result;
};

// ---------------------------------------------------------------------------------------------
// 8. Change feed, part 1: logical sequence numbers. Cosmos stamps every write of a partition with
// the next LSN, and its change feed lists documents in LSN order, with `_lsn` in each. Here the
// counter is per container (the server has one partition key range) and every new version gets
// the next number when Items._set stores it. The stamp is not enumerable, so that point reads and
// queries do not show it (they do not in Cosmos either); the change feed adds it to what it returns.
// Each stamped version is also appended to documents._changeLog, which is therefore in LSN order: a
// read of the feed finds where its continuation stops by binary search and walks on from there, so
// that a poll costs what it returns, not the container's size (scanning the container cost 2 ms per
// poll at 6,000 documents and 8 ms at 30,000). A logged version is current while _data still holds
// that very object; superseded, deleted and expired versions are skipped when read and dropped when
// the log has grown to twice the live documents. A version a failed batch removes stops being
// current; the one the rollback puts back is current again, under its old number, so the feed never
// shows a write that was undone. No compaction while a batch runs, so that nothing it may put back
// has left the log.
// ---------------------------------------------------------------------------------------------
const COMPACT_LOG_ABOVE = 1000; // entries, on top of twice the live documents

function stampLsn(documents, doc) {
  documents._lastLsn = (documents._lastLsn || 0) + 1;
  Object.defineProperty(doc, "_lsn", { value: documents._lastLsn, writable: true, configurable: true });
  if (!documents._changeLog) documents._changeLog = [];
  const log = documents._changeLog;
  log.push(doc);
  if (!documents._undo && log.length > 2 * documents._data.size + COMPACT_LOG_ABOVE) {
    documents._changeLog = log.filter(version => version === doc || isCurrent(documents, version));
  }
}

function isCurrent(documents, version) {
  const item = documents._data.get(version._rid);
  return item !== undefined && item.read() === version;
}

/** The current, unexpired versions with an LSN above `after`, in LSN order, as long as `accept` takes them. */
function changesAfter(documents, after, accept) {
  const log = documents._changeLog || [];
  let low = 0;
  let high = log.length;
  while (low < high) {
    const middle = (low + high) >>> 1;
    if (log[middle]._lsn <= after) low = middle + 1;
    else high = middle;
  }
  for (let i = low; i < log.length; i += 1) {
    const version = log[i];
    if (!isCurrent(documents, version)) continue;
    if (isExpired(documents, version)) evict(documents, version);
    else if (!accept(version)) break;
  }
}

// ---------------------------------------------------------------------------------------------
// 2. (continued) Undo journal for transactional batches. Every document write of the package ends in
// one of two primitives of Items: _set(doc) stores a new version (create; replace, after deleting the
// old one), delete(id, partition) removes one. While a batch runs, documents._undo is an array and
// each primitive records its inverse there; rolling back replays the inverses last first. The cost
// is one entry per write of the batch, whatever the container's size (copying both maps before
// each batch, as this launcher first did, cost 0.2 ms of CPU per batch at 0 documents, 1.2 ms at
// 6,000 and 6 ms at 30,000; with the journal, 0.15-0.25 ms at all three). Documents that TTL evicts
// during a batch are not journaled: they are expired, so leaving them out is what a rollback must show.
// The same two primitives keep the indexes of 9. (and a rollback, which bypasses _set and delete,
// keeps them through evict and store).
// ---------------------------------------------------------------------------------------------
const baseSet = Items.prototype._set;
Documents.prototype._set = function setStampedAndJournaled(doc) {
  stampLsn(this, doc); // 8.
  if (this._undo) this._undo.push({ remove: doc });
  return store(this, doc);
};

/** Items._set without a new LSN or a journal entry, and the version indexed (9.). */
function store(documents, doc) {
  const stored = baseSet.call(documents, doc);
  index(documents, doc);
  return stored;
}

const baseDelete = Items.prototype.delete;
Documents.prototype.delete = function deleteJournaled(idOrRid, partition) {
  const doc = this._item("/id", idOrRid, partition).read();
  baseDelete.call(this, idOrRid, partition); // throws when there is none
  unindex(this, doc); // 9.
  if (this._undo) this._undo.push({ restore: doc });
};

function rollBack(documents, undo) {
  for (let i = undo.length - 1; i >= 0; i -= 1) {
    const { remove, restore } = undo[i];
    if (remove) evict(documents, remove);
    else store(documents, restore); // the very version that was deleted: same _etag, _ts, _rid
  }
}

// ---------------------------------------------------------------------------------------------
// 7. What Cosmos refuses. Every document write ends in Documents.create or Documents.replace (upsert
// calls one of them, patch calls replace with the patched document) and every container write in
// Collections.create or Collections.replace, so the checks sit there; a CosmosError thrown there
// becomes the answer (withCosmosErrors below, and each operation of a batch).
//   - An item is at most 2 MB as JSON: larger ones get 413 RequestEntityTooLarge.
//   - Its id is at most 255 characters: 400.
//   - Its id holds none of / \ ? #: 400. Cosmos documents / and \ as refused by the service; ? and #
//     it stores, but the Python SDK puts the id into the item's URL unescaped, so such an item cannot
//     be read, replaced or deleted by id (the SDK refuses all four on create_item, upsert_item and
//     replace_item itself; a batch sends them as they are). Refused here on every path: stricter.
//   - Its partition key value is at most 2,048 bytes of UTF-8 (large partition keys, partitionKey
//     version 2, the SDK's default): 400. The same limit applies to a version-1 container here; its
//     101-byte rule is not modelled.
//   - Its `ttl`, when present, must be -1 (never expire) or 1 to 2147483647 seconds: 0, other
//     negative numbers, null or a non-integer get 400. The azure-cosmos test suite expects 400 for
//     0, -10 and null on a container with TTL on; this server refuses them whatever the container's
//     TTL setting.
//   - A container's defaultTtl must be null/absent (TTL off), -1 (on, no default) or 1 to 2147483647:
//     400 otherwise, on create and on replace.
// ---------------------------------------------------------------------------------------------
const isValidTtl = value => value === -1 || (Number.isInteger(value) && value >= 1 && value <= MAX_TTL);

function checkDocument(documents, doc) {
  if (Buffer.byteLength(JSON.stringify(doc)) > MAX_ITEM_BYTES) {
    throw new CosmosError(413, "Request size is too large.");
  }
  if (typeof doc.id === "string" && doc.id.length > MAX_ID_LENGTH) {
    throw new CosmosError(400, `The id is ${doc.id.length} characters long; at most ${MAX_ID_LENGTH} are allowed.`);
  }
  if (typeof doc.id === "string" && ID_FORBIDDEN.test(doc.id)) {
    throw new CosmosError(400, `The input name '${doc.id}' is invalid. Ensure to provide a unique non-empty string ` +
      "that does not contain '/', '\\', '?' or '#'.");
  }
  const key = documents._getPartition(doc);
  const keyBytes = typeof key === "string" ? Buffer.byteLength(key) : 0;
  if (keyBytes > MAX_PARTITION_KEY_BYTES) {
    throw new CosmosError(400, `The partition key value is ${keyBytes} bytes long; at most ` +
      `${MAX_PARTITION_KEY_BYTES} bytes are allowed.`);
  }
  if (Object.prototype.hasOwnProperty.call(doc, "ttl") && !isValidTtl(doc.ttl)) {
    throw new CosmosError(400, `The input ttl '${doc.ttl}' is invalid. Ensure to provide a nonzero positive ` +
      `integer less than or equal to '${MAX_TTL}', or '-1' which means never expire.`);
  }
}

function checkContainer(container) {
  const { defaultTtl } = container;
  if (defaultTtl !== undefined && defaultTtl !== null && !isValidTtl(defaultTtl)) {
    throw new CosmosError(400, `The value of defaultTtl '${defaultTtl}' is invalid. It must be -1 or a nonzero ` +
      `positive integer less than or equal to '${MAX_TTL}'.`);
  }
}

const baseDocumentCreate = Items.prototype.create;
Documents.prototype.create = function createChecked(data) {
  checkDocument(this, data);
  return baseDocumentCreate.call(this, data);
};

const baseDocumentReplace = Items.prototype.replace;
Documents.prototype.replace = function replaceChecked(data, original) {
  checkDocument(this, data);
  return baseDocumentReplace.call(this, data, original);
};

const baseCollectionCreate = Items.prototype.create;
Collections.prototype.create = function createChecked(data) {
  checkContainer(data);
  return baseCollectionCreate.call(this, data);
};

// ---------------------------------------------------------------------------------------------
// 5. Patch filter predicates. The package lower-cases the whole condition before evaluating it, so
// `from c where c.Version = 3` tests c.version and string literals lose their case. Evaluate the
// predicate as written, against the one document, then let the package apply the patch without it.
// ---------------------------------------------------------------------------------------------
function conditionQuery(condition) {
  const text = condition.trim();
  if (/^select\b/i.test(text)) return text;
  if (/^from\b/i.test(text)) return `SELECT * ${text}`; // the SDK's form: "from c where ..."
  if (/^where\b/i.test(text)) return `SELECT * FROM c ${text}`;
  return `SELECT * FROM c WHERE ${text}`;
}

// 7. The first set or add whose parent object is not in the document, by its path; or none.
function missingParent(doc, operations) {
  for (const op of operations) {
    if (!["set", "add"].includes(op.op) || typeof op.path !== "string") continue;
    const segments = op.path.split("/").slice(1, -1);
    let node = doc;
    for (const segment of segments) {
      node = node !== null && typeof node === "object" ? node[segment] : undefined;
      if (node === null || typeof node !== "object") return op.path;
    }
  }
  return null;
}

const basePatchOperation = patchOps.patchOperation;
patchOps.patchOperation = function patchOperation(collection, input) {
  // 7. The package refuses more than 10 operations too, but only once the document has been found and
  // the predicate has held (404 or 412 first). Refused here first, as a malformed request, whatever the
  // document (an assumption about the order in which Cosmos checks: not compared with Azure).
  if (Array.isArray(input.operations) && input.operations.length > MAX_PATCH_OPERATIONS) {
    return errorResult(400, `The number of patch operations can't exceed ${MAX_PATCH_OPERATIONS}; ` +
      `the request has ${input.operations.length}.`);
  }
  const nested = Array.isArray(input.operations) &&
    input.operations.some(op => typeof op.path === "string" && op.path.split("/").length > 2);
  if (!input.condition && !nested) return basePatchOperation(collection, input);
  const partition = partitionHeader.parsePartitionKey(input.partitionKey, input.id);
  const doc = collection.document(input.id, partition).read();
  if (!doc) return errorResult(404, NOT_FOUND_MESSAGE);
  if (input.ifMatch && input.ifMatch !== doc._etag) {
    return errorResult(412, "Operation cannot be performed because one of the specified precondition is not met.");
  }
  const orphan = nested && missingParent(doc, input.operations);
  if (orphan) {
    return errorResult(400, `Add Operation can only create a child object of an existing node (array or object) ` +
      `and can't create path recursively: ${orphan}`);
  }
  if (!input.condition) return basePatchOperation(collection, input);
  let matches;
  try {
    const { documents } = collection;
    const { result } = documents._getQuery(conditionQuery(input.condition))
      .exec([doc], { udf: documents._userDefinedFunctions() });
    matches = result.length > 0;
  } catch (err) {
    return errorResult(400, `Invalid filter predicate in patch request: ${err.message}`);
  }
  if (!matches) return errorResult(412, "Condition specified in the patch request is not satisfied.");
  return basePatchOperation(collection, { ...input, condition: undefined });
};

// ---------------------------------------------------------------------------------------------
// 9. Cost per request. Cosmos answers from indexes, so a request costs about what it touches; the
// package scans, and worse (figures in the header). Four changes:
//   - The query engine (@zeit/cosmosdb-query) compiles each FROM and JOIN into
//     `.reduce(($, c) => [...$, { c }], [])`, which copies its accumulator for every document: O(N^2)
//     per query. Its compiled syntax tree is rewritten to append in place (`$h.appendInPlace`), and
//     helpers.stripUndefined, which copied the same way over every result row, is linear too. The
//     compiled query function is kept per query text (the engine made a new Function per execution).
//   - Per container, three indexes kept by the primitives (_set, delete, evict, and a rollback's store):
//     partition key value -> rids; every rid in _rid order (the order the engine sorts results in);
//     and an expiry schedule, a min-heap of (expiry second, version) of the versions with a TTL.
//     Deleted rids and superseded versions stay in the last two until they are looked at or the index
//     has grown to twice the live documents; a rid is only inserted when it is new. Before each query
//     and read feed, 3. pops the schedule's due entries instead of scanning every document.
//   - A partition-scoped query scans that partition's documents only, from its index.
//   - A page of a query that is evaluated document by document (no ORDER BY, TOP or aggregate: the
//     engine answers it with paginate(..., _rid)) is computed from the documents at and after its
//     continuation's _rid, in a chunk of twice the page size; a chunk that gives too few rows is read
//     again, larger by what it gave (to the end when it gave none), so that page k no longer filters
//     and sorts every document again. The chunk's page is the one the whole scan gives: the same rows
//     from the same starting point, and the same continuation token.
// ORDER BY, TOP and aggregates still evaluate their whole scope (partition or container) per page.
// Page sizes (7.): a page holds at most x-ms-max-item-count rows, 100 when the header is absent, and
// with -1 as many as 4 MB allows; a page whose rows' JSON is over 4 MB is computed again holding the
// rows that fit (at least one, however large), from the same start, so that the engine's continuation
// resumes after its last row. Every paginated query pages so, by the engine's own continuation: ORDER
// BY and TOP too. An aggregate is one row, in one page.
// ---------------------------------------------------------------------------------------------
const COMPACT_INDEX_ABOVE = 1000; // stale entries tolerated, on top of as many as the live documents
const FIRST_CHUNK = 256; // documents, at least; or twice the page size
const COMPILED_QUERIES_KEPT = 500;

function indexes(documents) {
  if (!documents._indexes) {
    documents._indexes = { partitions: new Map(), order: [], ordered: new Set(), expiry: [] };
  }
  return documents._indexes;
}

/** The first position in the sorted array of strings whose value is not below `value`. */
function lowerBound(sorted, value) {
  let low = 0;
  let high = sorted.length;
  while (low < high) {
    const middle = (low + high) >>> 1;
    if (sorted[middle] < value) low = middle + 1;
    else high = middle;
  }
  return low;
}

function index(documents, doc) {
  const ix = indexes(documents);
  const rid = doc._rid;
  const key = documents._getPartition(doc);
  let rids = ix.partitions.get(key);
  if (!rids) ix.partitions.set(key, (rids = new Set()));
  rids.add(rid);
  if (!ix.ordered.has(rid)) {
    ix.order.splice(lowerBound(ix.order, rid), 0, rid);
    ix.ordered.add(rid);
  }
  schedule(documents, doc);
}

function unindex(documents, doc) {
  const ix = indexes(documents);
  const key = documents._getPartition(doc);
  const rids = ix.partitions.get(key);
  if (rids) {
    rids.delete(doc._rid);
    if (rids.size === 0) ix.partitions.delete(key);
  }
  if (ix.order.length > 2 * documents._data.size + COMPACT_INDEX_ABOVE) {
    ix.order = ix.order.filter(rid => documents._data.has(rid));
    ix.ordered = new Set(ix.order);
  }
}

function schedule(documents, doc) {
  const ttl = effectiveTtl(documents, doc);
  if (ttl === null || typeof doc._ts !== "number") return;
  const { expiry } = indexes(documents);
  heapPush(expiry, { at: doc._ts + ttl, doc });
  if (expiry.length > 2 * documents._data.size + COMPACT_INDEX_ABOVE) rescheduleExpiry(documents);
}

/** The expiry schedule made again from the current versions (the container's defaultTtl may have changed). */
function rescheduleExpiry(documents) {
  indexes(documents).expiry = [];
  for (const item of documents._data.values()) schedule(documents, item.read());
}

function heapPush(heap, entry) {
  heap.push(entry);
  let i = heap.length - 1;
  while (i > 0) {
    const parent = (i - 1) >>> 1;
    if (heap[parent].at <= entry.at) break;
    heap[i] = heap[parent];
    i = parent;
  }
  heap[i] = entry;
}

function heapPop(heap) {
  const top = heap[0];
  const last = heap.pop();
  if (heap.length > 0) {
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= heap.length) break;
      const child = left + 1 < heap.length && heap[left + 1].at < heap[left].at ? left + 1 : left;
      if (heap[child].at >= last.at) break;
      heap[i] = heap[child];
      i = child;
    }
    heap[i] = last;
  }
  return top;
}

// The query engine. Its lib/index.js reads transformer.default and executor.default, and the compiled
// code the helpers, through their module objects at each call, so replacing the exports is enough.
queryHelpers.appendInPlace = (target, items) => {
  for (let i = 0; i < items.length; i += 1) target.push(items[i]);
  return target;
};

queryHelpers.stripUndefined = value => {
  if (Array.isArray(value)) {
    const kept = [];
    for (const v of value) if (typeof v !== "undefined") kept.push(queryHelpers.stripUndefined(v));
    return kept;
  }
  if (value && typeof value === "object") {
    const kept = {};
    for (const [k, v] of Object.entries(value)) if (typeof v !== "undefined") kept[k] = queryHelpers.stripUndefined(v);
    return kept;
  }
  return value;
};

const isIdentifier = (node, name) => node && node.type === "Identifier" && node.name === name;

/** `[...$, a, ...b]`, the body (or a conditional's branch) of a reduce over `$`, as `$h.appendInPlace($, [a, ...b])`. */
function appendingBody(body) {
  if (body.type === "ConditionalExpression") return { ...body, consequent: appendingBody(body.consequent) };
  if (body.type !== "ArrayExpression" || !body.elements.length) return body;
  const [first, ...rest] = body.elements;
  if (!first || first.type !== "SpreadElement" || !isIdentifier(first.argument, "$")) return body;
  return {
    type: "CallExpression",
    callee: { type: "MemberExpression", object: { type: "Identifier", name: "$h" },
      property: { type: "Identifier", name: "appendInPlace" }, computed: false },
    arguments: [{ type: "Identifier", name: "$" }, { type: "ArrayExpression", elements: rest }],
  };
}

/** Rewrites every `x.reduce(($, ...) => [...$, ...], [])` in the compiled tree to append in place. */
function appendInPlace(node) {
  if (Array.isArray(node)) {
    node.forEach(appendInPlace);
    return;
  }
  if (!node || typeof node !== "object") return;
  for (const key of Object.keys(node)) appendInPlace(node[key]);
  const [callback, initial] = node.arguments || [];
  if (node.type === "CallExpression" && node.callee.type === "MemberExpression"
      && isIdentifier(node.callee.property, "reduce") && node.arguments.length === 2
      && callback.type === "ArrowFunctionExpression" && isIdentifier(callback.params[0], "$")
      && initial.type === "ArrayExpression" && initial.elements.length === 0) {
    callback.body = appendingBody(callback.body); // `[]` is a new array per evaluation: appending is safe
  }
}

// Queries answered with paginate(...) (every one but aggregates), and of those the ones whose page is
// paginate(rows sorted by _rid): evaluated document by document (see above).
const PAGINATED = new WeakMap();
const BY_DOCUMENT = new WeakMap();
const baseTransform = queryTransformer.default;
queryTransformer.default = sqlAst => {
  const compiled = baseTransform(sqlAst);
  appendInPlace(compiled);
  const [statement] = compiled.body.body;
  const answer = statement && statement.argument;
  const paginated = Boolean(answer && answer.type === "CallExpression" && answer.callee.type === "MemberExpression"
    && isIdentifier(answer.callee.property, "paginate"));
  PAGINATED.set(sqlAst, paginated);
  BY_DOCUMENT.set(sqlAst, paginated && answer.arguments.length === 4
    && Boolean(sqlAst.body && !sqlAst.body.top && !sqlAst.body.orderBy));
  return compiled;
};

const compiledQueries = new Map();
queryExecutor.default = (collection, { code, parameters, udf = {}, maxItemCount, continuation, compositeIndexes }) => {
  let execute = compiledQueries.get(code);
  if (!execute) {
    execute = new Function(`"use strict";return (${code})`)(); // eslint-disable-line no-new-func
    if (compiledQueries.size >= COMPILED_QUERIES_KEPT) compiledQueries.clear();
    compiledQueries.set(code, execute);
  }
  const params = {};
  (parameters || []).forEach(({ name, value }) => {
    params[name.slice(1)] = value;
  });
  return execute(aggregateFunctions, builtinFunctions, collection, queryHelpers, udf, params, maxItemCount,
    continuation, compositeIndexes);
};

/** What Items.query does, over the scope's documents only, a page at a time where it can (see above). */
function runQuery(documents, sql, parameters, { partition, maxItemCount, continuation }) {
  const container = documents._parent.read();
  const q = documents._getQuery(sql); // a syntax error propagates as the package lets it (400)
  const options = {
    parameters, udf: documents._userDefinedFunctions(), continuation,
    compositeIndexes: ((container.indexingPolicy ? container.indexingPolicy.compositeIndexes : null) || []),
  };
  try {
    if (!q.code) throw new Error("Missing code"); // compiles it, and so fills BY_DOCUMENT and PAGINATED
    const rids = scopeRids(documents, partition);
    let page = evaluatePage(documents, q, rids, options, pageItems(maxItemCount));
    const fit = rowsWithin(page.result, MAX_PAGE_BYTES);
    // Over 4 MB: the page of the rows that fit, from the same start, with the engine's own continuation.
    if (fit < page.result.length && PAGINATED.get(q.ast)) page = evaluatePage(documents, q, rids, options, fit);
    return page;
  } catch (err) {
    err.badRequest = true;
    throw err;
  }
}

/** Items a page may hold: x-ms-max-item-count; 100 when it is absent; Infinity (4 MB decides) for -1. */
function pageItems(maxItemCount) {
  if (maxItemCount === null || maxItemCount === undefined || Number.isNaN(maxItemCount)) return DEFAULT_PAGE_ITEMS;
  return maxItemCount > 0 ? maxItemCount : Infinity;
}

/** How many of the rows, from the first, fit in `budget` bytes of JSON; at least one. */
function rowsWithin(rows, budget) {
  if (rows.length <= 1) return rows.length;
  let bytes = 0;
  for (let i = 0; i < rows.length; i += 1) {
    const text = JSON.stringify(rows[i]);
    bytes += (text === undefined ? 4 : Buffer.byteLength(text)) + (i > 0 ? 1 : 0); // the comma between rows
    if (bytes > budget) return Math.max(i, 1);
  }
  return rows.length;
}

/** The page of at most `limit` rows after the continuation: from a chunk of the scope where the query allows it. */
function evaluatePage(documents, q, rids, options, limit) {
  const paged = { ...options, maxItemCount: Number.isFinite(limit) ? limit : undefined };
  const start = Number.isFinite(limit) && BY_DOCUMENT.get(q.ast) ? continuationStart(rids, options.continuation) : -1;
  if (start < 0) return q.exec(documentsOf(documents, rids, 0, Infinity).docs, paged);
  for (let size = Math.max(2 * limit, FIRST_CHUNK); ;) {
    const { docs, end } = documentsOf(documents, rids, start, size);
    const page = q.exec(docs, paged);
    if (page.continuation || end >= rids.length) return page;
    // Too few rows: the next chunk (from the same start) is sized by the rows this one gave.
    const rows = page.result.length;
    size = rows ? Math.max(2 * size, Math.ceil((1.5 * size * (limit + 1)) / rows)) : Infinity;
  }
}

/** The rids a query scans, in _rid order (the container's may include deleted ones). */
function scopeRids(documents, partition) {
  if (!partition) return indexes(documents).order;
  return [...(indexes(documents).partitions.get(partition.value) || [])].sort();
}

/** Where the page after `continuation` starts in `rids`; -1 if its token cannot be read (the engine then says why). */
function continuationStart(rids, continuation) {
  if (!continuation) return 0;
  try {
    const { RID } = continuationToken.decode(continuation.token);
    return typeof RID === "string" ? lowerBound(rids, RID) : -1;
  } catch (err) {
    return -1;
  }
}

/** Up to `count` live documents from position `start` of `rids`, and the position after the last. */
function documentsOf(documents, rids, start, count) {
  const docs = [];
  let i = start;
  for (; i < rids.length && docs.length < count; i += 1) {
    const item = documents._data.get(rids[i]);
    if (item) docs.push(item.read());
  }
  return { docs, end: i };
}

// ---------------------------------------------------------------------------------------------
// Replacement route handlers
// ---------------------------------------------------------------------------------------------

// 1. lib/handler/read-document.js dereferences the document before checking that it exists
// (TypeError -> 500). Answer 404 for a missing, deleted or expired document; otherwise delegate.
const fixReadDocument = original => (account, req, res, params) => {
  const collection = account.database(params.dbId).collection(params.collId);
  const header = partitionHeader.default(req);
  if (collection.read() && header) {
    const partition = partitionHeader.parsePartitionKey(header, params.docId);
    if (!collection.document(params.docId, partition).read()) {
      res.statusCode = 404;
      return errorResult(404, NOT_FOUND_MESSAGE).body;
    }
  }
  return original(account, req, res, params);
};

// 4. Same as lib/handler/query-documents.js, except that a partition-key header restricts the
// query to that partition (the package ignored it and, unless the query text itself filtered on
// the key, answered 400 "missing partition keys").
const queryDocuments = () => async (account, req, res, { dbId, collId }) =>
  readItems(req, res, "Documents", async ({ continuation, maxItemCount }) => {
    const body = await readJson(req);
    if (!body.query) {
      res.statusCode = 400;
      return { message: "missing query" };
    }
    const collection = account.database(dbId).collection(collId);
    const partition = requestPartition(req);
    if (!partition && !trueHeader(req, "x-ms-documentdb-query-enablecrosspartition")) {
      const paths = ((collection.read() || {}).partitionKey || {}).paths || [];
      if (paths.length && !collection.documents._getQuery(body.query).containsPartitionKeys(paths)) {
        res.statusCode = 400;
        return { message: "missing partition keys" };
      }
    }
    try {
      return collection.documents.query(body, { continuation, maxItemCount, partition });
    } catch (err) {
      if (!err.badRequest) throw err;
      res.statusCode = 400;
      return { message: err.message };
    }
  });

// 8. Change feed, part 2: GET .../docs with `A-IM: Incremental feed` (the latest-version mode).
// lib/handler/read-documents.js returned every document whatever the headers, and lib/index.js turns
// any 200 answer to a request with A-IM and If-None-Match into 304 with etag "1". What the Python SDK
// sends (azure/cosmos/_change_feed) and what Cosmos answers:
//   - If-None-Match: absent = from the beginning; "*" = from now; otherwise the etag of an earlier
//     answer (here the quoted LSN, e.g. "42"), to resume after the change it ended with;
//   - If-Modified-Since (start_time=datetime): only documents written at or after that second;
//   - x-ms-max-item-count: at most that many documents (absent or -1: every change, here);
//   - x-ms-documentdb-partitionkey (with partition_key_range_id): only that logical partition.
// The answer is 200 with {"Documents": [...]}: the latest version of each document changed after the
// continuation, oldest change first, each with its `_lsn`, and an etag header that resumes after the
// last of them; or 304, no body, when nothing is new, with an etag that resumes from there. Deleted
// and expired documents do not appear (the latest-version mode has no deletes). Not served: the
// all-versions-and-deletes mode, and a feed range narrower than the container (the SDK's
// partition_key or feed_range option, sent as an effective-partition-key range this server cannot
// compute): both answer 400 rather than a feed with other partitions' documents in it.
const lsnEtag = lsn => `"${lsn}"`;

function changeFeedStart(req, documents) {
  const ifNoneMatch = req.headers["if-none-match"];
  if (!ifNoneMatch) return 0;
  if (ifNoneMatch === "*") return documents._lastLsn || 0;
  const lsn = /^"?(\d+)"?$/.exec(ifNoneMatch);
  if (!lsn) throw new CosmosError(400, `Invalid change feed continuation (If-None-Match) ${ifNoneMatch}.`);
  return Number(lsn[1]);
}

function changeFeedSince(req) {
  const header = req.headers["if-modified-since"];
  if (!header) return undefined;
  const millis = Date.parse(header);
  if (Number.isNaN(millis)) throw new CosmosError(400, `Invalid If-Modified-Since header ${header}.`);
  return Math.floor(millis / 1000);
}

function readChanges(collection, req, res) {
  const { documents } = collection;
  if (req.headers["x-ms-read-key-type"] === "EffectivePartitionKeyRange") {
    throw new CosmosError(400, "This local server serves the change feed of a whole container only, " +
      "not of a partition key or feed range.");
  }
  const after = changeFeedStart(req, documents);
  const since = changeFeedSince(req);
  const maxItemCount = parseInt(req.headers["x-ms-max-item-count"], 10);
  const limit = maxItemCount > 0 ? maxItemCount : Infinity;
  const partition = requestPartition(req);
  const page = [];
  changesAfter(documents, after, doc => {
    if ((since === undefined || doc._ts >= since) && (!partition || inPartition(documents, doc, partition))) {
      page.push(doc);
    }
    return page.length < limit;
  });
  if (page.length === 0) {
    res.statusCode = 304;
    res.setHeader("etag", lsnEtag(Math.max(after, documents._lastLsn || 0)));
    return undefined;
  }
  res.statusCode = 200;
  res.setHeader("etag", lsnEtag(page[page.length - 1]._lsn));
  res.setHeader("x-ms-item-count", String(page.length));
  const changes = page.map(doc => ({ ...doc, _lsn: doc._lsn }));
  return { _rid: collection.read()._rid, Documents: changes, _count: changes.length };
}

const readDocumentsOrChanges = original => (account, req, res, params) => {
  const aim = req.headers["a-im"];
  if (!aim) return original(account, req, res, params);
  delete req.headers["a-im"]; // so that lib/index.js leaves this answer's status and etag alone
  if (aim.toLowerCase() !== "incremental feed") {
    throw new CosmosError(400, `This local server serves the latest-version change feed only (A-IM: ${aim}).`);
  }
  return readChanges(account.database(params.dbId).collection(params.collId), req, res);
};

// 2. Transactional batch. The package's handler runs operations one by one and keeps the writes
// of the ones before a failure; it needs a partition key on each operation (the Python SDK sends
// one in the header for the whole batch) and has no Patch. This one:
//   - gives every operation the header's partition key, and rejects documents of another partition;
//   - supports Create, Upsert, Read, Replace, Delete and Patch (with ifMatch / filter predicate);
//   - on the first failure undoes the writes of the operations before it with the undo journal
//     above, last first (Node runs the loop without interruption, so no other request can observe
//     the intermediate state), and answers 207 with the failing operation's own status and 424 for
//     every other operation, as Cosmos does: all or nothing.
// Non-atomic batches (bulk, from other SDKs) keep the package's behaviour: no rollback, 200.
function runOperation(collection, op, partition) {
  const { documents } = collection;
  const body = op.resourceBody;
  if (["Create", "Upsert", "Replace"].includes(op.operationType)) {
    if (!body || typeof body !== "object") return errorResult(400, "Operation has no resource body.");
    if (partition && !inPartition(documents, body, partition)) {
      return errorResult(400, "PartitionKey extracted from document doesn't match the one specified in the header.");
    }
  }
  switch (op.operationType) {
    case "Create": return documentOps.createOperation(collection, op);
    case "Upsert": return documentOps.upsertOperation(collection, op);
    case "Replace": return documentOps.replaceOperation(collection, op);
    case "Read": return documentOps.readOperation(collection, op);
    case "Delete": return documentOps.deleteOperation(collection, op);
    case "Patch":
      if (!body || !Array.isArray(body.operations)) return errorResult(400, "Patch operation has no operations.");
      return patchOps.patchOperation(collection, {
        id: op.id, partitionKey: op.partitionKey, ifMatch: op.ifMatch,
        operations: body.operations, condition: body.condition,
      });
    default: return errorResult(400, `Operation type '${op.operationType}' is not supported in Batch.`);
  }
}

const batchDocuments = () => async (account, req, res, params) => {
  const operations = await readJson(req);
  if (!Array.isArray(operations)) {
    res.statusCode = 400;
    return { message: "Invalid request body" };
  }
  if (operations.length === 0 || operations.length > MAX_BATCH_OPERATIONS) {
    res.statusCode = 400;
    return { message: `A batch must have 1 to ${MAX_BATCH_OPERATIONS} operations; got ${operations.length}.` };
  }
  if (Buffer.byteLength(JSON.stringify(operations)) > MAX_BATCH_BYTES) {
    res.statusCode = 413;
    return { message: "Request size is too large." };
  }
  // The Python SDK always sends x-ms-cosmos-batch-atomic: true; bulk requests of other SDKs send false.
  const atomic = !req.headers["x-ms-cosmos-batch-atomic"] || trueHeader(req, "x-ms-cosmos-batch-atomic");
  const continueOnError = !atomic && trueHeader(req, "x-ms-cosmos-batch-continue-on-error");
  const collection = account.database(params.dbId).collection(params.collId);
  const { documents } = collection;
  const header = partitionHeader.default(req);
  const partition = requestPartition(req);
  const undo = atomic ? [] : undefined;
  const results = [];
  let failedIndex = -1;
  documents._undo = undo; // journal the writes (see "Undo journal" above)
  try {
    operations.forEach((operation, i) => {
      if (failedIndex >= 0 && !continueOnError) {
        results.push(errorResult(424, "Failed dependency."));
        return;
      }
      let result;
      try {
        result = runOperation(collection, { partitionKey: header, ...operation }, partition);
      } catch (err) {
        result = errorResult(err instanceof CosmosError ? err.statusCode : 400, err.message);
      }
      results.push(result);
      if (result.statusCode >= 400 && failedIndex < 0) failedIndex = i;
    });
  } finally {
    documents._undo = undefined;
  }
  const response = results.map(({ statusCode, body }, i) => {
    if (atomic && failedIndex >= 0 && i !== failedIndex) return { statusCode: 424, requestCharge: 0 };
    if (statusCode >= 400) return { statusCode, requestCharge: 1, resourceBody: body };
    return { statusCode, requestCharge: 1, eTag: body ? body._etag : undefined, resourceBody: body };
  });
  if (atomic && failedIndex >= 0) {
    rollBack(documents, undo);
    res.statusCode = 207; // Multi-Status, as Cosmos answers a failed transactional batch
  } else {
    res.statusCode = 200;
  }
  return response;
};

// ---------------------------------------------------------------------------------------------
// Route table: lib/routes.js calls router.default({METHOD: {path: handler}}) once, at load time.
// Swap in the replacements above and wrap every handler so errors carry Cosmos' body shape.
// ---------------------------------------------------------------------------------------------
const DOC = "/dbs/:dbId/colls/:collId/docs";
const REPLACEMENTS = {
  GET: { [`${DOC}/:docId`]: fixReadDocument, [DOC]: readDocumentsOrChanges },
  POST_QUERY: { [DOC]: queryDocuments },
  POST_BATCH: { [DOC]: batchDocuments },
};

const withCosmosErrors = handler => async (account, req, res, params) => {
  // Document routes on a missing database/container answer 404 (create, for one, crashes with 500).
  if (params.collId !== undefined && !account.database(params.dbId).collection(params.collId).read()) {
    res.statusCode = 404;
    return errorResult(404, "Resource Not Found").body;
  }
  let body;
  try {
    body = await handler(account, req, res, params);
  } catch (err) {
    if (!(err instanceof CosmosError)) throw err;
    res.statusCode = err.statusCode;
    return errorResult(err.statusCode, err.message).body;
  }
  if (res.statusCode >= 400) {
    body = body && typeof body === "object" ? body : {};
    if (!body.code) body.code = ERROR_CODES[res.statusCode] || "Error";
    if (!body.message) body.message = res.statusCode === 404 ? NOT_FOUND_MESSAGE : body.code;
  }
  return body;
};

// 7. `Prefer: return=minimal`, which the Python SDK sends on document writes for no_response=True
// (or a client's no_response_on_write). Cosmos then answers a create, upsert, replace or patch with
// its usual status and headers, the document's etag among them, and an empty body; the SDK returns
// an empty dict. Errors keep their body.
const MINIMAL_RESPONSE_ROUTES = { POST: [DOC], POST_UPSERT: [DOC], PUT: [`${DOC}/:docId`], PATCH: [`${DOC}/:docId`] };

const withoutBodyIfMinimal = handler => async (account, req, res, params) => {
  const body = await handler(account, req, res, params);
  if (res.statusCode >= 400 || !/\breturn=minimal\b/i.test(req.headers.prefer || "")) return body;
  if (body && body._etag) res.setHeader("etag", body._etag);
  return undefined; // lib/index.js then ends the response with no body
};

const baseRouter = router.default;
router.default = rules => {
  const patched = {};
  for (const [method, routes] of Object.entries(rules)) {
    patched[method] = {};
    for (const [route, handler] of Object.entries(routes)) {
      const replace = (REPLACEMENTS[method] || {})[route];
      let wrapped = replace ? replace(handler) : handler;
      if ((MINIMAL_RESPONSE_ROUTES[method] || []).includes(route)) wrapped = withoutBodyIfMinimal(wrapped);
      patched[method][route] = withCosmosErrors(wrapped);
    }
  }
  return baseRouter(patched);
};

// ---------------------------------------------------------------------------------------------
// 6. Start. lib/cli.js creates its server without options, so every response carries
// `connection: close` and each SDK call opens a new TCP connection. createHttpServer({keepAlive:
// true}) sends `connection: keep-alive` and Node keeps the socket open. The idle timeout is raised
// from Node's 5 s so that a pooled client connection is not closed just as it is reused.
// ---------------------------------------------------------------------------------------------
const { createHttpServer } = load("index");

// --verbose: one line per request on stderr. The operation is read from the headers as lib/router.js
// reads them, before any handler runs (the change feed's handler removes its A-IM header).
function operationOf(req) {
  const flag = name => String(req.headers[name] || "").toLowerCase() === "true";
  if (req.method === "POST" && (flag("x-ms-documentdb-isquery") || req.headers["content-type"] === "application/query+json")) {
    return "query";
  }
  if (flag("x-ms-documentdb-is-upsert")) return "upsert";
  if (flag("x-ms-cosmos-is-batch-request")) return "batch";
  if (req.headers["a-im"]) return "change-feed";
  return { GET: "read", POST: "create", PUT: "replace", PATCH: "patch", DELETE: "delete" }[req.method] || "other";
}

function pathOf(url) {
  let path = (url || "/").split("?")[0];
  if (path.startsWith("//")) path = path.slice(1); // the SDK sends a double slash, as lib/router.js notes
  while (path.length > 1 && path.endsWith("/")) path = path.slice(0, -1);
  return path;
}

function logRequest(req, res) {
  const started = process.hrtime.bigint();
  const operation = operationOf(req);
  const path = pathOf(req.url);
  res.on("close", () => {
    const ms = Number(process.hrtime.bigint() - started) / 1e6;
    const status = res.writableFinished ? res.statusCode : "aborted";
    process.stderr.write(`${new Date().toISOString()} ${operation} ${req.method} ${path} ${status} ${ms.toFixed(1)} ms\n`);
  });
}

function main(args) {
  const server = createHttpServer({ keepAlive: true });
  if (args.verbose) server.prependListener("request", logRequest);
  server.keepAliveTimeout = 120 * 1000;
  server.headersTimeout = 125 * 1000;
  server.on("error", err => fail(`cannot listen on ${args.host}:${args.port}: ${err.message}`));
  server.listen(args.port, args.host, () => {
    const { port } = server.address();
    const host = args.host.includes(":") ? `[${args.host}]` : args.host;
    process.stdout.write(`listening on http://${host}:${port}\n`);
  });
  const stop = () => {
    server.close(() => process.exit(0));
    server.closeAllConnections();
    setTimeout(() => process.exit(0), 2000).unref();
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  if (args.exitOnStdinClose) {
    process.stdin.on("end", stop).on("close", stop).resume();
  }
}

main(ARGS);
