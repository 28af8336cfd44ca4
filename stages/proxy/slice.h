/*
 * slice.h: the proxy's (pointer, length) views are lib/core's (core/slice.h), shared with the
 * HTTP/1.1 parser of lib/http.
 */
#ifndef ARCLIGHT_PROXY_SLICE_H
#define ARCLIGHT_PROXY_SLICE_H

#include "core/slice.h"

#endif
