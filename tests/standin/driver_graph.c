/*
 * The stand-in driver (see driver_internal.h): graphs, with memory allocation and free nodes.
 */
#define _GNU_SOURCE
#include "driver_internal.h"

#include <stdlib.h>

/* ================================================================ graphs */

enum node_kind { NODE_MEM_ALLOC, NODE_MEM_FREE };

struct CUgraphNode_st {
    enum node_kind kind;
    CUdeviceptr dptr;
    struct CUgraphNode_st *next;
};

struct CUgraph_st {
    struct CUgraphNode_st *nodes;
    struct CUgraph_st *next;
};

static struct CUgraph_st *g_graphs;

/* Under g_lock. */
static int valid_graph_locked(CUgraph g) {
    for (struct CUgraph_st *x = g_graphs; x; x = x->next)
        if (x == g)
            return 1;
    return 0;
}

static int valid_deps_locked(CUgraph g, const CUgraphNode *deps, size_t n) {
    if (n && !deps)
        return 0;
    for (size_t i = 0; i < n; i++) {
        int ok = 0;
        for (struct CUgraphNode_st *x = g->nodes; x; x = x->next)
            if (x == deps[i])
                ok = 1;
        if (!ok)
            return 0;
    }
    return 1;
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    NEED_INIT();
    if (!phGraph || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    g->next = g_graphs;
    g_graphs = g;
    pthread_mutex_unlock(&g_lock);
    *phGraph = g;
    return CUDA_SUCCESS;
}

/* The address is handed out when the node is made (as CUDA does) and stays the graph's until
 * the graph is destroyed. */
CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
    NEED_CTX();
    if (!phGraphNode || !nodeParams || nodeParams->bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodeParams->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !valid_device(nodeParams->poolProps.location.id))
        return CUDA_ERROR_INVALID_VALUE;
    if (nodeParams->accessDescCount && !nodeParams->accessDescs)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r;
    uintptr_t p = 0;
    pthread_mutex_lock(&g_lock);
    if (!valid_graph_locked(hGraph) || !valid_deps_locked(hGraph, dependencies, numDependencies)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        r = alloc_locked(&p, nodeParams->bytesize, K_GRAPH, &g_main);
        if (r == CUDA_SUCCESS) {
            live_block_at(p, NULL)->graph = hGraph;
            n->kind = NODE_MEM_ALLOC;
            n->dptr = p;
            n->next = hGraph->nodes;
            hGraph->nodes = n;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (r) {
        free(n);
        return r;
    }
    nodeParams->dptr = p;
    *phGraphNode = n;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies, size_t numDependencies,
                               CUdeviceptr dptr) {
    NEED_CTX();
    if (!phGraphNode)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    struct block *b = live_block_at((uintptr_t)dptr, NULL);
    if (!valid_graph_locked(hGraph) || !valid_deps_locked(hGraph, dependencies, numDependencies))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (!b || (b->kind != K_GRAPH && b->kind != K_ASYNC))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        n->kind = NODE_MEM_FREE;
        n->dptr = dptr;
        n->next = hGraph->nodes;
        hGraph->nodes = n;
    }
    pthread_mutex_unlock(&g_lock);
    if (r) {
        free(n);
        return r;
    }
    *phGraphNode = n;
    return CUDA_SUCCESS;
}

/* Memory of the graph's allocation nodes still held goes back to the arena. */
CUresult cuGraphDestroy(CUgraph hGraph) {
    NEED_INIT();
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (struct CUgraph_st **gp = &g_graphs; *gp; gp = &(*gp)->next)
        if (*gp == hGraph) {
            *gp = hGraph->next;
            found = 1;
            break;
        }
    if (found) {
        for (struct CUgraphNode_st *n = hGraph->nodes, *next; n; n = next) {
            next = n->next;
            if (n->kind == NODE_MEM_ALLOC) {
                struct arena *a = NULL;
                struct block *b = live_block_at((uintptr_t)n->dptr, &a);
                if (b && b->kind == K_GRAPH && b->graph == hGraph && !b->pending_free)
                    arena_release(a, b);
            }
            free(n);
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    free(hGraph);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGraphMemTrim(CUdevice device) {
    NEED_INIT();
    return valid_device(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
