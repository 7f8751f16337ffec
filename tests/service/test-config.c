/* SPDX-License-Identifier: MIT */
/* dsd.json parsing: every field read and range-checked, every refusal naming the field and
 * its line:column, unknown fields and wrong types refused, command-line overrides, and the
 * JSON round trip. */
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "test_util.h"

/* Every leaf field, as written in the file. */
static const char *const leaf_keys[] = {
        "model",
        "backend",
        "device",
        "quantize_at_load",
        "lm_head_int8",
        "lm_head_screen",
        "limits.context_length",
        "limits.max_batch",
        "limits.queue_length",
        "limits.kv_memory_fraction",
        "limits.client_max_requests",
        "limits.client_max_pending_events",
        "limits.client_max_pending_bytes",
        "socket.path",
        "socket.mode",
        "socket.allowed_uids",
        "socket.allowed_gids",
        "log_level",
        "bus",
        "stop_timeout_sec",
};

static int parse(const char *json, DsdConfig *c, DsError *err)
{
        return config_parse("t.json", json, strlen(json), c, err);
}

/* Parsing must fail, leave c untouched, and the message must contain every needle. */
static void expect_fail(const char *json, const char *needle1, const char *needle2)
{
        DsdConfig c;
        DsError err = {};
        int r;

        memset(&c, 0x5a, sizeof(c));
        r = parse(json, &c, &err);
        CHECK(r < 0, "accepted: %s", json);
        CHECK(strstr(err.msg, needle1), "'%s' lacks '%s': %s", err.msg, needle1, json);
        CHECK(!needle2 || strstr(err.msg, needle2), "'%s' lacks '%s': %s", err.msg, needle2, json);
        CHECK(((unsigned char *) &c)[0] == 0x5a && ((unsigned char *) &c)[sizeof(c) - 1] == 0x5a,
                "failed parse wrote the result: %s", json);
}

static void expect_ok(const char *json, DsdConfig *c)
{
        DsError err = {};
        int r = parse(json, c, &err);
        CHECK(r == 0, "refused %s: %s", json, err.msg);
}

static void test_defaults(void)
{
        DsdConfig c, p;

        config_init(&c);
        CHECK(c.model[0] == 0, "model");
        CHECK(c.backend == CONFIG_BACKEND_AUTO, "backend");
        CHECK(c.device == 0 && !c.quantize_at_load && !c.lm_head_int8 && c.lm_head_screen,
                "device/quantize");
        char dev[32];
        config_device(&c, dev, sizeof(dev));
        CHECK(strcmp(dev, "0") == 0, "device string %s", dev);
        CHECK(c.limits.context_length == 0, "context_length");
        CHECK(c.limits.max_batch == 16, "max_batch");
        CHECK(c.limits.queue_length == 256, "queue_length");
        CHECK(c.limits.kv_memory_fraction == 0.9, "kv_memory_fraction");
        CHECK(c.limits.client_max_requests == 16, "client_max_requests");
        CHECK(c.limits.client_max_pending_events == 4096, "client_max_pending_events");
        CHECK(c.limits.client_max_pending_bytes == 16u << 20, "client_max_pending_bytes");
        CHECK(strcmp(c.socket_path, "/run/dsd/dsd.sock") == 0, "socket.path");
        CHECK(c.socket_mode == 0660, "socket.mode %o", (unsigned) c.socket_mode);
        CHECK(c.n_allowed_uids == 0 && c.n_allowed_gids == 0, "allowed ids");
        CHECK(c.log_level == LOG_LVL_INFO, "log_level");
        CHECK(c.bus == CONFIG_BUS_SYSTEM, "bus");

        /* An empty object, and null groups, are the defaults. */
        expect_ok("{}", &p);
        CHECK(memcmp(&c, &p, sizeof(c)) == 0, "{} is not the defaults");
        expect_ok("{\"limits\": null, \"socket\": null, \"model\": null, \"device\": null}", &p);
        CHECK(memcmp(&c, &p, sizeof(c)) == 0, "nulls are not the defaults");
}

static void test_every_field(void)
{
        DsdConfig c;
        char dev[32];

        expect_ok("{\n"
                  "  \"model\": \"/var/lib/dsd/models/qwen\",\n"
                  "  \"backend\": \"cuda\",\n"
                  "  \"device\": 3,\n"
                  "  \"quantize_at_load\": true,\n"
                  "  \"lm_head_int8\": true,\n"
                  "  \"lm_head_screen\": false,\n"
                  "  \"limits\": {\n"
                  "    \"context_length\": 8192,\n"
                  "    \"max_batch\": 64,\n"
                  "    \"queue_length\": 0,\n"
                  "    \"kv_memory_fraction\": 0.5,\n"
                  "    \"client_max_requests\": 4,\n"
                  "    \"client_max_pending_events\": 100,\n"
                  "    \"client_max_pending_bytes\": 1048576\n"
                  "  },\n"
                  "  \"socket\": {\n"
                  "    \"path\": \"/tmp/x.sock\",\n"
                  "    \"mode\": \"600\",\n"
                  "    \"allowed_uids\": [\"root\", 65534, 1000],\n"
                  "    \"allowed_gids\": [\"root\", 7]\n"
                  "  },\n"
                  "  \"log_level\": \"debug\",\n"
                  "  \"bus\": \"session\"\n"
                  "}\n",
                &c);
        CHECK(strcmp(c.model, "/var/lib/dsd/models/qwen") == 0, "model");
        CHECK(c.backend == CONFIG_BACKEND_CUDA && c.device == 3 && c.quantize_at_load &&
                        c.lm_head_int8 && !c.lm_head_screen,
                "backend");
        config_device(&c, dev, sizeof(dev));
        CHECK(strcmp(dev, "3 no-screen") == 0, "device string %s", dev);
        CHECK(c.limits.context_length == 8192 && c.limits.max_batch == 64 &&
                        c.limits.queue_length == 0 && c.limits.kv_memory_fraction == 0.5 &&
                        c.limits.client_max_requests == 4 &&
                        c.limits.client_max_pending_events == 100 &&
                        c.limits.client_max_pending_bytes == 1048576,
                "limits");
        CHECK(strcmp(c.socket_path, "/tmp/x.sock") == 0 && c.socket_mode == 0600, "socket");
        CHECK(c.n_allowed_uids == 3 && c.allowed_uids[0] == 0 && c.allowed_uids[1] == 65534 &&
                        c.allowed_uids[2] == 1000,
                "uids");
        CHECK(c.n_allowed_gids == 2 && c.allowed_gids[0] == 0 && c.allowed_gids[1] == 7, "gids");
        CHECK(c.log_level == LOG_LVL_DEBUG && c.bus == CONFIG_BUS_SESSION, "log/bus");

        expect_ok("{\"backend\": \"cpu\", \"bus\": \"none\", \"log_level\": \"error\","
                  " \"model\": \"\", \"socket\": {\"mode\": \"0000\"},"
                  " \"limits\": {\"kv_memory_fraction\": 1}}",
                &c);
        CHECK(c.backend == CONFIG_BACKEND_CPU && c.bus == CONFIG_BUS_NONE &&
                        c.log_level == LOG_LVL_ERR && c.model[0] == 0 && c.socket_mode == 0 &&
                        c.limits.kv_memory_fraction == 1.0,
                "second set");
}

/* A value of the wrong type for every field is refused naming it at its line and column:
 * the key sits on line 3 (nested) or 2 (top level), column 5 or 3. */
static void test_wrong_types(void)
{
        for (size_t i = 0; i < ELEMENTSOF(leaf_keys); i++) {
                const char *dot = strchr(leaf_keys[i], '.');
                char json[256], field[96], pos[32];

                if (dot)
                        snprintf(json, sizeof(json), "{\n  \"%.*s\": {\n    \"%s\": {}\n  }\n}",
                                (int) (dot - leaf_keys[i]), leaf_keys[i], dot + 1);
                else
                        snprintf(json, sizeof(json), "{\n  \"%s\": {}\n}", leaf_keys[i]);
                snprintf(field, sizeof(field), "field '%s' must be", leaf_keys[i]);
                snprintf(pos, sizeof(pos), "t.json:%s: ", dot ? "3:5" : "2:3");
                expect_fail(json, field, pos);

                /* And a boolean where a number or a string is wanted, a number where a
                 * boolean is. */
                bool boolean = strcmp(leaf_keys[i], "quantize_at_load") == 0 ||
                               strcmp(leaf_keys[i], "lm_head_int8") == 0 ||
                               strcmp(leaf_keys[i], "lm_head_screen") == 0;
                if (dot)
                        snprintf(json, sizeof(json), "{\"%.*s\": {\"%s\": true}}",
                                (int) (dot - leaf_keys[i]), leaf_keys[i], dot + 1);
                else
                        snprintf(json, sizeof(json), "{\"%s\": %s}", leaf_keys[i],
                                boolean ? "1" : "true");
                expect_fail(json, field, boolean ? "got 1" : "got true");
        }
}

static void test_ranges(void)
{
        expect_fail("{\"limits\": {\"max_batch\": 0}}", "t.json:1:13: field 'limits.max_batch'",
                "an integer in [1, 1024], got 0");
        expect_fail("{\"limits\": {\"max_batch\": 1025}}", "limits.max_batch", "got 1025");
        expect_fail("{\"limits\": {\"max_batch\": 2.5}}", "limits.max_batch", "got 2.5");
        expect_fail("{\"limits\": {\"max_batch\": -1}}", "limits.max_batch", NULL);
        expect_fail("{\"limits\": {\"max_batch\": 1e400}}", "limits.max_batch", NULL);
        expect_fail("{\"device\": 256}", "field 'device'", "[0, 255]");
        expect_fail("{\"limits\": {\"context_length\": 16777217}}", "limits.context_length", NULL);
        expect_fail("{\"limits\": {\"queue_length\": 65537}}", "limits.queue_length", NULL);
        expect_fail(
                "{\"limits\": {\"kv_memory_fraction\": 0}}", "limits.kv_memory_fraction", "(0, 1]");
        expect_fail("{\"limits\": {\"kv_memory_fraction\": 1.01}}", "kv_memory_fraction", NULL);
        expect_fail("{\"limits\": {\"client_max_requests\": 0}}", "client_max_requests", NULL);
        expect_fail("{\"limits\": {\"client_max_pending_events\": 15}}",
                "client_max_pending_events", NULL);
        expect_fail("{\"limits\": {\"client_max_pending_bytes\": 4095}}",
                "client_max_pending_bytes", NULL);
        expect_fail("{\"limits\": {\"client_max_pending_bytes\": 4294967297}}",
                "client_max_pending_bytes", NULL);
        expect_fail("{\"backend\": \"tpu\"}", "field 'backend'", "\"auto\", \"cpu\" or \"cuda\"");
        expect_fail("{\"backend\": \"CPU\"}", "field 'backend'", NULL);
        expect_fail("{\"bus\": \"user\"}", "field 'bus'", NULL);
        expect_fail("{\"log_level\": \"verbose\"}", "field 'log_level'", NULL);
        expect_fail("{\"model\": \"models/x\"}", "field 'model'", "absolute path");
        expect_fail("{\"socket\": {\"path\": \"dsd.sock\"}}", "field 'socket.path'", NULL);

        char json[512];
        snprintf(json, sizeof(json), "{\"socket\": {\"path\": \"/%0107d\"}}", 0);
        expect_fail(json, "field 'socket.path'", "shorter than 108");
        snprintf(json, sizeof(json), "{\"socket\": {\"path\": \"/%0106d\"}}", 0);
        DsdConfig c;
        expect_ok(json, &c);
        CHECK(strlen(c.socket_path) == 107, "107-byte socket path");

        expect_fail("{\"socket\": {\"mode\": \"0888\"}}", "field 'socket.mode'", "octal");
        expect_fail("{\"socket\": {\"mode\": \"01777\"}}", "field 'socket.mode'", NULL);
        expect_fail("{\"socket\": {\"mode\": \"66\"}}", "field 'socket.mode'", NULL);
        expect_fail("{\"socket\": {\"mode\": \"0660 \"}}", "field 'socket.mode'", NULL);
        expect_fail("{\"socket\": {\"mode\": 432}}", "field 'socket.mode'", "got 432");
        expect_fail("{\"socket\": {\"allowed_uids\": \"root\"}}", "socket.allowed_uids",
                "an array of uids");
        expect_fail("{\"socket\": {\"allowed_uids\": [-1]}}", "socket.allowed_uids", "got -1");
        expect_fail("{\"socket\": {\"allowed_uids\": [4294967295]}}", "socket.allowed_uids", NULL);
        expect_fail("{\"socket\": {\"allowed_uids\": [\"Root\"]}}", "socket.allowed_uids", NULL);
        expect_fail("{\"socket\": {\"allowed_uids\": [\"no-such-user-dsd\"]}}",
                "socket.allowed_uids", "user 'no-such-user-dsd', which does not exist");
        expect_fail("{\"socket\": {\"allowed_gids\": [\"no-such-group-dsd\"]}}",
                "socket.allowed_gids", "group 'no-such-group-dsd', which does not exist");
        expect_fail("{\"socket\": {\"allowed_gids\": [[0]]}}", "socket.allowed_gids", NULL);

        /* CONFIG_IDS_MAX entries are accepted, one more is not. */
        size_t n = snprintf(json, sizeof(json), "{\"socket\": {\"allowed_uids\": [0");
        for (unsigned i = 1; i < CONFIG_IDS_MAX; i++)
                n += snprintf(json + n, sizeof(json) - n, ",%u", i);
        snprintf(json + n, sizeof(json) - n, "]}}");
        expect_ok(json, &c);
        CHECK(c.n_allowed_uids == CONFIG_IDS_MAX && c.allowed_uids[63] == 63, "64 uids");
        snprintf(json + n, sizeof(json) - n, ",64]}}");
        expect_fail(json, "socket.allowed_uids", "more than 64 entries");
}

static void test_structure(void)
{
        expect_fail("{\"modle\": \"/x\"}", "t.json:1:2: field 'modle' is not a known field", NULL);
        expect_fail("{\n\t\"limits\": {\"max_bach\": 1}}",
                "t.json:2:13: field 'limits.max_bach' is not a known field", NULL);
        expect_fail("{\"limits.max_batch\": 4}", "field 'limits.max_batch' is not a known", NULL);
        /* "http" is daemon/http's object: only its type is checked here. */
        expect_fail("{\"http\": 1}", "field 'http'", "an object");
        expect_fail("{\"htp\": {}}", "field 'htp' is not a known field", NULL);
        expect_fail("{\"limits\": 3}", "t.json:1:2: field 'limits' must be an object", "got 3");
        expect_fail("{\"socket\": []}", "field 'socket' must be an object", NULL);
        expect_fail("{\"device\": 1,\n \"device\": 2}",
                "t.json:1:2: field 'device' appears more than once", NULL);
        expect_fail("{\"limits\": {\"max_batch\": 1, \"max_batch\": 2}}",
                "field 'limits.max_batch' appears more than once", NULL);

        /* The position is that of the key at the right depth, not the first same name. */
        expect_fail("{\n"
                    "  \"socket\": {\"path\": \"/run/x\"},\n"
                    "  \"x\": {\"path\": 1},\n"
                    "  \"limits\": {\n"
                    "      \"path\": 1}}",
                "t.json:3:3: field 'x' is not a known field", NULL);
        expect_fail("{\n"
                    "  \"model\": \"/m\", \"z\": {\"max_batch\": 1},\n"
                    "  \"limits\": {\n"
                    "      \"max_batch\": 0}}",
                "t.json:2:18: field 'z'", NULL);
        expect_fail("{\"socket\": {\"path\": \"/a\"}, \"limits\": {\"q\": 0, \"path\": 1}}",
                "t.json:1:39: field 'limits.q'", NULL);
        /* Key-like text inside a string is not a key. */
        expect_fail("{\"model\": \"/\\\"limits\\\": {\\\"max_batch\\\": 1\","
                    " \"limits\": {\"max_batch\": 0}}",
                "t.json:1:56: field 'limits.max_batch'", NULL);

        /* Syntax errors carry cJSON's position. */
        expect_fail("{\"model\": }", "t.json:1:", "not valid JSON");
        expect_fail("{\n\n  \"device\": 1,,\n}", "t.json:3:", "not valid JSON");
        expect_fail("", "t.json:1:1: not valid JSON", NULL);
        expect_fail("{} x", "t.json:1:4: unexpected text after the JSON object", NULL);
        expect_fail("[]", "t.json:1:1: the top level must be an object", NULL);
        expect_fail("\n  3", "t.json:2:3: the top level must be an object", NULL);

        DsdConfig c;
        DsError err = {};
        CHECK(config_parse("t.json", "{\"model\": \"/a\0b\"}", 17, &c, &err) < 0 &&
                        strstr(err.msg, "NUL byte"),
                "NUL: %s", err.msg);
        CHECK(config_parse(NULL, "{}", 2, &c, &err) == -EINVAL, "NULL name");
        CHECK(config_parse("t.json", NULL, 0, &c, &err) < 0, "NULL text is empty, not JSON");
}

static void test_overrides(void)
{
        DsdConfig c, before;
        DsError err = {};
        char cwd[PATH_MAX], want[PATH_MAX + 16];

        expect_ok("{\"model\": \"/m\", \"limits\": {\"max_batch\": 4}}", &c);
        CHECK(config_set(&c, "--max-batch", "limits.max_batch", "32", &err) == 0, "%s", err.msg);
        CHECK(c.limits.max_batch == 32, "max_batch override");
        CHECK(config_set(&c, "--backend", "backend", "cpu", &err) == 0, "%s", err.msg);
        CHECK(config_set(&c, "--quantize-at-load", "quantize_at_load", "yes", &err) == 0, "q");
        CHECK(config_set(&c, "--lm-head-int8", "lm_head_int8", "true", &err) == 0, "%s", err.msg);
        CHECK(config_set(&c, "--no-lm-head-screen", "lm_head_screen", "false", &err) == 0, "%s",
                err.msg);
        CHECK(config_set(&c, "--kv-fraction", "limits.kv_memory_fraction", "0.25", &err) == 0, "f");
        CHECK(config_set(&c, "--socket-mode", "socket.mode", "0600", &err) == 0, "mode");
        CHECK(config_set(&c, "--allow-group", "socket.allowed_gids", "root,5", &err) == 0, "%s",
                err.msg);
        CHECK(config_set(&c, "--bus", "bus", "session", &err) == 0, "bus");
        CHECK(config_set(&c, "--log-level", "log_level", "warning", &err) == 0, "log");
        CHECK(c.backend == CONFIG_BACKEND_CPU && c.quantize_at_load && c.lm_head_int8 &&
                        !c.lm_head_screen && c.limits.kv_memory_fraction == 0.25 &&
                        c.socket_mode == 0600 && c.n_allowed_gids == 2 && c.allowed_gids[0] == 0 &&
                        c.allowed_gids[1] == 5 && c.bus == CONFIG_BUS_SESSION &&
                        c.log_level == LOG_LVL_WARNING,
                "overrides applied");
        CHECK(strcmp(c.model, "/m") == 0, "untouched field kept");

        /* A relative model on the command line is the working directory's; "" clears. */
        CHECK(config_set(&c, "--model", "model", "models/tiny", &err) == 0, "%s", err.msg);
        CHECK(getcwd(cwd, sizeof(cwd)), "getcwd");
        snprintf(want, sizeof(want), "%s/models/tiny", cwd);
        CHECK(strcmp(c.model, want) == 0, "relative model: %s", c.model);
        CHECK(config_set(&c, "--model", "model", "", &err) == 0 && c.model[0] == 0, "clear");

        /* Refusals name the flag and the field, and change nothing. */
        before = c;
        CHECK(config_set(&c, "--max-batch", "limits.max_batch", "lots", &err) < 0 &&
                        strstr(err.msg,
                                "--max-batch: field 'limits.max_batch' must be an integer") &&
                        strstr(err.msg, "got \"lots\""),
                "%s", err.msg);
        CHECK(config_set(&c, "--max-batch", "limits.max_batch", "0", &err) < 0, "range");
        CHECK(config_set(&c, "--max-batch", "limits.max_batch", " 3", &err) < 0, "space");
        CHECK(config_set(&c, "--quantize-at-load", "quantize_at_load", "maybe", &err) < 0, "b");
        CHECK(config_set(&c, "--lm-head-int8", "lm_head_int8", "often", &err) < 0 &&
                        strstr(err.msg, "--lm-head-int8: field 'lm_head_int8'"),
                "%s", err.msg);
        CHECK(config_set(&c, "--allow-user", "socket.allowed_uids", "0,nobody-nope", &err) < 0 &&
                        strstr(err.msg, "nobody-nope"),
                "%s", err.msg);
        CHECK(config_set(&c, "--frob", "frob", "1", &err) == -EINVAL &&
                        strstr(err.msg, "--frob: unknown field 'frob'"),
                "%s", err.msg);
        CHECK(config_set(&c, "--max-batch", "limits", "1", &err) == -EINVAL, "a group is no field");
        CHECK(memcmp(&c, &before, sizeof(c)) == 0, "refused overrides changed the config");
}

static void test_json_round_trip(void)
{
        _cleanup_free_ char *a = NULL, *b = NULL, *d = NULL;
        DsdConfig c, p, defaults;

        expect_ok("{\"model\": \"/m\", \"device\": 2, \"socket\": {\"mode\": \"0640\","
                  " \"allowed_uids\": [0, 17]}, \"limits\": {\"kv_memory_fraction\": 0.3}}",
                &c);
        CHECK(config_to_json(&c, &a) == 0, "to_json");
        CHECK(parse(a, &p, NULL) == 0, "to_json output does not parse:\n%s", a);
        CHECK(config_to_json(&p, &b) == 0 && strcmp(a, b) == 0, "round trip:\n%s\n%s", a, b);
        CHECK(strstr(a, "\"mode\":\t\"0640\"") && strstr(a, "\"model\":\t\"/m\""), "%s", a);

        config_init(&defaults);
        CHECK(config_to_json(&defaults, &d) == 0 && strstr(d, "\"model\":\tnull"), "%s", d);
}

static void test_load(void)
{
        char dir[] = "/tmp/test-config-XXXXXX", path[64];
        DsdConfig c;
        DsError err = {};
        int fd;

        CHECK(mkdtemp(dir), "mkdtemp");
        snprintf(path, sizeof(path), "%s/dsd.json", dir);
        CHECK(config_load(path, true, &c, &err) == 0 && c.limits.max_batch == 16, "missing ok");
        CHECK(config_load(path, false, &c, &err) == -ENOENT && strstr(err.msg, path), "%s",
                err.msg);
        fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        CHECK(fd >= 0, "create");
        const char *text = "{\n  \"limits\": {\n    \"max_batch\": 2000\n  }\n}\n";
        CHECK(write(fd, text, strlen(text)) == (ssize_t) strlen(text), "write");
        close(fd);
        CHECK(config_load(path, true, &c, &err) < 0, "bad file accepted");
        char want[128];
        snprintf(want, sizeof(want), "%s:3:5: field 'limits.max_batch'", path);
        CHECK(strstr(err.msg, want), "'%s' lacks '%s'", err.msg, want);
        CHECK(truncate(path, 0) == 0, "truncate");
        fd = open(path, O_WRONLY | O_CLOEXEC);
        CHECK(fd >= 0 && write(fd, "{\"device\": 1}", 13) == 13, "rewrite");
        close(fd);
        CHECK(config_load(path, false, &c, &err) == 1 && c.device == 1, "%s", err.msg);
        CHECK(config_load(dir, false, &c, &err) < 0 && strstr(err.msg, "not a regular file"), "%s",
                err.msg);
        unlink(path);
        rmdir(dir);
}

int main(void)
{
        test_defaults();
        test_every_field();
        test_wrong_types();
        test_ranges();
        test_structure();
        test_overrides();
        test_json_round_trip();
        test_load();
        printf("test-config: ok\n");
        return 0;
}
