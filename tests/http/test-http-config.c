/* SPDX-License-Identifier: MIT */
/* The "http" object of dsd.json: every documented field is taken, and a misspelt or
 * out-of-range one is refused naming it, as the rest of dsd.json's fields are. */
#include <cjson/cJSON.h>
#include <string.h>

#include "listener.h"
#include "test_util.h"

static int parse(const char *json, HttpConfig *ret, DsError *err)
{
        cJSON *j = cJSON_Parse(json);
        CHECK(j, "test JSON parses: %s", json);
        http_config_init(ret);
        int r = http_config_parse(j, ret, err);
        cJSON_Delete(j);
        return r;
}

static void expect_fail(const char *json, const char *want)
{
        HttpConfig c;
        DsError err = {};
        int r = parse(json, &c, &err);
        CHECK(r == -EINVAL, "%s: accepted (%d)", json, r);
        CHECK(strstr(err.msg, want), "%s: message '%s' lacks '%s'", json, err.msg, want);
}

int main(void)
{
        HttpConfig c;
        DsError err = {};

        CHECK(parse("{\"listen\": \"127.0.0.1:8080\", \"auth_token_file\": \"/etc/dsd/token\", "
                    "\"max_connections\": 8, \"request_timeout_ms\": 2000, "
                    "\"idle_timeout_ms\": 3000, \"max_header_bytes\": 4096, "
                    "\"max_body_bytes\": 65536}",
                      &c, &err) == 0,
                "every documented field: %s", err.msg);
        CHECK(!strcmp(c.listen, "127.0.0.1:8080") && c.max_connections == 8 &&
                        c.request_timeout_ms == 2000 && c.idle_timeout_ms == 3000 &&
                        c.limits.max_head_bytes == 4096 && c.limits.max_body_bytes == 65536,
                "the fields are taken");
        CHECK(parse("{}", &c, &err) == 0 && c.max_connections == 64, "an empty object: defaults");

        expect_fail("{\"listen\": \"127.0.0.1:8080\", \"max_body_byte\": 5}",
                "field 'http.max_body_byte' is not a known field");
        expect_fail("{\"Listen\": \"127.0.0.1:8080\"}", "field 'http.Listen' is not a known field");
        expect_fail("{\"max_connections\": 0}", "field 'http.max_connections'");
        expect_fail("{\"max_body_bytes\": -1}", "field 'http.max_body_bytes'");
        expect_fail("{\"listen\": 5}", "field 'http.listen'");
        return 0;
}
