-- wrk script: PUT one prepared body to one path, again and again.
-- Arguments (after `--`): <path> <body-file>
-- For a server that reads the body and keeps nothing (bench/stacks.py's streamed PUT): no key
-- pool to prepare, and wrk sends one request built once instead of concatenating a new one
-- per request (put.lua's 1 MiB concatenation, not the server, limited its rate here).
-- Prints one machine-readable line starting with "WRKJSON " from done().

function init(args)
  -- wrk: args[0] is the URL, script arguments (after `--`) start at args[1]
  local f = assert(io.open(args[2], "rb"))
  local body = f:read("*a")
  f:close()
  _G.req = wrk.format("PUT", args[1], {["Content-Type"] = "application/octet-stream"}, body)
end

function request()
  return req
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"err_connect":%d,' ..
    '"err_read":%d,"err_write":%d,"err_timeout":%d,"err_status":%d,' ..
    '"lat_mean_us":%.1f,"lat_p50_us":%d,"lat_p90_us":%d,"lat_p99_us":%d,"lat_max_us":%d,"wrapped":0}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.timeout, e.status, latency.mean, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max))
end
