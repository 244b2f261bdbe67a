-- wrk: like send_message.lua, but "/delay 0" makes the echo agent report working first, so the
-- message takes the scheduled path (actor mailbox, spawned execution, event sink).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["A2A-Version"] = "1.0"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","messageId":"m1","parts":[{"text":"/delay 0 hello"}]}}}'
