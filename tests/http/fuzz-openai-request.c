/* SPDX-License-Identifier: MIT */
/* The OpenAI request decoders on arbitrary bytes: the first byte picks chat, completion,
 * tokenize or detokenize; every refusal must carry a 4xx/5xx status and a message, and
 * its error JSON must be well formed. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>

#include "openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        OaiError e = {};
        int r;

        if (size == 0)
                return 0;
        const char *body = (const char *) data + 1;
        size_t len = size - 1;
        switch (data[0] % 4) {
        case 0:
        case 1: {
                OaiRequest *q = NULL;
                r = oai_request_parse(data[0] % 2 ? OAI_COMPLETION : OAI_CHAT, body, len, &q, &e);
                oai_request_free(q);
                break;
        }
        case 2: {
                OaiTokenizeRequest *q = NULL;
                r = oai_tokenize_parse(body, len, &q, &e);
                oai_tokenize_free(q);
                break;
        }
        default: {
                int32_t *ids = NULL;
                size_t n;
                r = oai_detokenize_parse(body, len, 1000, &ids, &n, &e);
                free(ids);
                break;
        }
        }
        if (r < 0) {
                if (e.status < 400 || !e.message[0])
                        __builtin_trap();
                StrBuf b = {};
                if (oai_error_json(&b, &e) == 0) {
                        cJSON *j = cJSON_Parse(b.data);
                        if (!j)
                                __builtin_trap();
                        cJSON_Delete(j);
                }
                strbuf_free(&b);
        }
        return 0;
}
