// Runs the real duroxide-pg provider's own migration runner into one schema.
// Usage: node provision.js ADDON DSN SCHEMA
// ADDON is the duroxide runtime's native Node.js addon (npm
// duroxide-linux-x64-gnu), which contains duroxide-pg. connectWithSchema
// creates the schema when missing and applies upstream's migrations with
// upstream's runner, exactly as an application starting duroxide-pg would.
const [addon, dsn, schema] = process.argv.slice(2);
const duroxide = require(addon);
duroxide.JsPostgresProvider.connectWithSchema(dsn, schema)
  .then(() => process.exit(0))
  .catch((err) => {
    console.error(String(err && err.message ? err.message : err));
    process.exit(1);
  });
