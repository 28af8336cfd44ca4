/*
 * dist_gloo.cc: gloo behind dist_gloo.h. The store gloo rendezvouses through is rank 0's
 * (dist_store.h); the collectives are gloo's own (ring all-reduce, broadcast), with every
 * exception turned into an error string at this boundary.
 */
#include "model/gloo/dist_gloo.h"

#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <memory>
#include <string>
#include <vector>

namespace {

/* gloo's Store over rank 0's key-value store. Its methods throw on failure, as gloo's own
 * stores do; connectFullMesh passes the exception up to al_gloo_new. */
class StoreOverTcp : public gloo::rendezvous::Store {
  public:
    StoreOverTcp(al_dist_store *s, double timeout_s) : s_(s), timeout_s_(timeout_s) {}

    void set(const std::string &key, const std::vector<char> &data) override
    {
        char err[512];
        if (al_dist_store_set(s_, key.c_str(), data.data(), data.size(), err, sizeof err))
            throw std::runtime_error(err);
    }

    std::vector<char> get(const std::string &key) override
    {
        char err[512];
        size_t n = 0;
        char *v = static_cast<char *>(al_dist_store_get(s_, key.c_str(), timeout_s_, &n, err,
                                                        sizeof err));
        if (!v) throw std::runtime_error(err);
        std::vector<char> out(v, v + n);
        free(v);
        return out;
    }

    void wait(const std::vector<std::string> &keys) override { wait(keys, kDefaultTimeout); }

    void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &) override
    {
        for (const std::string &k : keys) (void)get(k); /* get waits until the key is there */
    }

  private:
    al_dist_store *s_;
    double timeout_s_;
};

int fail(char *errstr, size_t errlen, const char *what, const std::exception &e)
{
    std::snprintf(errstr, errlen, "dist: %s: %s", what, e.what());
    return -1;
}

} // namespace

struct al_gloo {
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    std::chrono::milliseconds timeout;
};

al_gloo *al_gloo_new(al_dist_store *store, int rank, int world, const char *local_host,
                     double timeout_s, char *errstr, size_t errlen)
{
    al_gloo *g = new (std::nothrow) al_gloo;
    if (!g) {
        std::snprintf(errstr, errlen, "dist: out of memory");
        return nullptr;
    }
    g->timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
    try {
        gloo::transport::tcp::attr attr;
        attr.hostname = local_host;
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        StoreOverTcp st(store, timeout_s);
        g->ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
        g->ctx->setTimeout(g->timeout);
        g->ctx->connectFullMesh(st, dev);
    } catch (const std::exception &e) {
        fail(errstr, errlen, "connecting the group's mesh", e);
        delete g;
        return nullptr;
    }
    return g;
}

void al_gloo_free(al_gloo *g)
{
    delete g;
}

int al_gloo_allreduce_f32(al_gloo *g, float *x, size_t n, char *errstr, size_t errlen)
{
    try {
        gloo::AllreduceOptions o(g->ctx);
        o.setOutput(x, n);
        o.setReduceFunction(
            static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
        o.setTimeout(g->timeout);
        gloo::allreduce(o);
    } catch (const std::exception &e) {
        return fail(errstr, errlen, "all-reduce", e);
    }
    return 0;
}

int al_gloo_allreduce_f64(al_gloo *g, double *x, size_t n, int max, char *errstr, size_t errlen)
{
    try {
        gloo::AllreduceOptions o(g->ctx);
        o.setOutput(x, n);
        if (max)
            o.setReduceFunction(static_cast<void (*)(void *, const void *, const void *, size_t)>(
                &gloo::max<double>));
        else
            o.setReduceFunction(static_cast<void (*)(void *, const void *, const void *, size_t)>(
                &gloo::sum<double>));
        o.setTimeout(g->timeout);
        gloo::allreduce(o);
    } catch (const std::exception &e) {
        return fail(errstr, errlen, "all-reduce", e);
    }
    return 0;
}

int al_gloo_broadcast_f32(al_gloo *g, float *x, size_t n, int root, char *errstr, size_t errlen)
{
    try {
        gloo::BroadcastOptions o(g->ctx);
        o.setOutput(x, n);
        o.setRoot(root);
        o.setTimeout(g->timeout);
        gloo::broadcast(o);
    } catch (const std::exception &e) {
        return fail(errstr, errlen, "broadcast", e);
    }
    return 0;
}
