//! `GET /v1/searches/{id}/report` and `GET /v1/candidates/{id}/report`: the HTML report
//! pages (`crate::report`). The handlers gather what a page shows from the store and the
//! backends (the search's timeline, the problem's seed, baselines cached for this GPU,
//! roofline floors, the strategy's summary or last checkpoint) and answer the page.

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use kiln_types::BackendKind;
use kiln_types::summary::Report;

use super::{ApiError, AppState};
use crate::report::{
    CandidateInputs, FloorLine, SearchInputs, SummarySource, candidate_page, search_page,
};

fn html(page: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        page,
    )
        .into_response()
}

/// The roofline floors of `spec` on the cuda backend (the host backend has no peak rates).
fn floors(s: &AppState, spec: &kiln_types::ProblemSpec) -> Vec<FloorLine> {
    let f = super::baselines::floor(s, spec);
    let mut out = Vec::new();
    if let Some(us) = f["floor_us"].as_f64() {
        out.push(FloorLine {
            label: "roofline floor".into(),
            us,
        });
    }
    if let Some(us) = f["floor_fp32_us"].as_f64()
        && out.first().is_none_or(|l| (l.us - us).abs() > 1e-9 * us)
    {
        out.push(FloorLine {
            label: "roofline floor, fp32 FMA".into(),
            us,
        });
    }
    out
}

/// What the search page of `id` shows.
async fn search_inputs(s: &AppState, id: &str) -> Result<SearchInputs, ApiError> {
    let search = s
        .store
        .get_search(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("search {id:?} not found")))?;
    let timeline = s.store.search_timeline(id).await?;
    let problem = s.store.get_problem(&search.problem).await?;
    // The backend its evaluations ran on; before any, its class's (a search routed to a
    // class), else where a new search of the problem would go.
    let routed = match (&problem, super::plugin::class_backend(&search.gpu_class)) {
        (_, Some(b)) => Some(b),
        (Some(p), None) => super::plugin::search_route(s, p).await.map(|(b, _)| b),
        (None, None) => None,
    };
    let backend = timeline
        .iter()
        .find_map(|e| e.evaluation.as_ref().map(|e| e.backend.clone()))
        .or_else(|| routed.map(|b| b.to_string()));
    let on_cuda = backend.as_deref().is_some_and(|b| b == BackendKind::Cuda);
    let seed_id = problem
        .as_ref()
        .zip(backend.as_deref())
        .and_then(|(p, b)| p.seed_candidate(b))
        .map(|c| c.content_hash());
    let baselines = if on_cuda {
        super::baselines::cached_here(s, &search.problem).await?
    } else {
        None
    };
    let floors = match (&problem, on_cuda) {
        (Some(p), true) => floors(s, p),
        _ => Vec::new(),
    };
    let final_summary = search
        .summary
        .as_ref()
        .and_then(|v| v.get("message"))
        .and_then(|m| m.as_str())
        .and_then(Report::from_message)
        .map(|r| (r, SummarySource::Final));
    let summary = match final_summary {
        Some(f) => Some(f),
        None if search.state == "running" => s
            .store
            .load_checkpoint(id)
            .await?
            .and_then(|b| Report::from_checkpoint(&b))
            .map(|r| (r, SummarySource::Checkpoint)),
        None => None,
    };
    Ok(SearchInputs {
        search,
        timeline,
        seed_id,
        backend,
        baselines,
        floors,
        summary,
        generated_at: crate::store::now_ms(),
    })
}

/// `GET /v1/searches/{id}/report`: the search's report page.
pub async fn search(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let inputs = search_inputs(&s, &id).await?;
    Ok(html(search_page::page(&inputs)))
}

/// `GET /v1/candidates/{id}/report`: the candidate's report page.
pub async fn candidate(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let record = s
        .store
        .get_candidate(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("candidate {id:?} not found")))?;
    let median = record.cuda_median_us();
    let speedups = match median {
        Some(m) => super::baselines::cached_here(&s, &record.candidate.problem)
            .await?
            .map(|set| set.speedups(m, kiln_types::baseline::Harness::of(record.trust())))
            .unwrap_or_default(),
        None => Vec::new(),
    };
    Ok(html(candidate_page::page(&CandidateInputs {
        record,
        speedups,
        generated_at: crate::store::now_ms(),
    })))
}
