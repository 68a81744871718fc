// stress-js-async: three PostgreSQL queries in parallel (Promise.all) on a pool ($DATABASE_URL).
const { Pool } = require("pg");

const pool = new Pool({ connectionString: process.env.DATABASE_URL, max: 5, connectionTimeoutMillis: 10000 });

exports.handle = async () => {
  const [version, count, max] = await Promise.all([
    pool.query("SELECT version() AS v"),
    pool.query("SELECT count(*)::int AS n FROM pg_class"),
    pool.query("SELECT max(oid)::text AS m FROM pg_class"),
  ]);
  return { version: version.rows[0].v.split(" ").slice(0, 2).join(" "), count: count.rows[0].n, max_id: max.rows[0].m };
};
